"""Training from Python against the tandem command: the same config gives the same losses."""
import json
import os
import signal
import subprocess
import sys
import threading

import pytest

import tandem
from conftest import BUILD, run_cli


def config_dict(corpus, **extra):
    d = {"model": "gpt2-tiny", "data": str(corpus), "batch": 2, "seq": 32, "steps": 6,
         "lr": 2e-3, "warmup": 2, "seed": 7}
    d.update(extra)
    return d


def cli_losses(tmp_path, cfg):
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg))
    metrics = tmp_path / "cli.jsonl"
    run_cli("train", "--config", path, "--metrics", metrics, "--progress", "none")
    return [json.loads(line)["loss"] for line in metrics.read_text().splitlines()
            if "loss" in json.loads(line)]


def test_trainer_equals_the_command_bit_for_bit(tmp_path, corpus):
    cfg = config_dict(corpus)
    expected = cli_losses(tmp_path, cfg)
    seen = []
    config = tandem.TrainConfig.from_json(str(tmp_path / "cfg.json"))
    trainer = tandem.Trainer(config)
    last = trainer.train(callback=lambda m: seen.append(m["loss"]))
    assert len(expected) == cfg["steps"]
    assert seen == expected  # bit for bit: the same program on the same CPU
    assert last["step"] == cfg["steps"] and trainer.steps_done == cfg["steps"]
    assert trainer.rank == 0 and trainer.world_size == 1
    assert trainer.model["name"] == "gpt2-tiny"


def test_step_by_step_and_in_pieces_equal_one_run(tmp_path, corpus):
    cfg = config_dict(corpus)
    whole = []
    tandem.Trainer(cfg).train(callback=lambda m: whole.append(m["loss"]))
    t = tandem.Trainer(cfg)
    pieces = [t.step()["loss"]]
    t.train(steps=2, callback=lambda m: pieces.append(m["loss"]))
    assert t.steps_done == 3
    t.train(callback=lambda m: pieces.append(m["loss"]))
    assert pieces == whole
    assert t.train()["step"] == 0  # nothing left


def test_recompute_trains_the_same_steps(corpus):
    kept, again = [], []
    tandem.Trainer(config_dict(corpus)).train(callback=lambda m: kept.append(m["loss"]))
    config = tandem.TrainConfig(**config_dict(corpus), recompute="unit")
    assert config.recompute == "unit"
    tandem.Trainer(config).train(callback=lambda m: again.append(m["loss"]))
    assert again == kept  # bit for bit: the same kernels recompute the same values
    first = tandem.TrainConfig(**config_dict(corpus), recompute="attention", recompute_blocks=2)
    assert first.recompute_blocks == 2
    partial = []
    tandem.Trainer(first).train(callback=lambda m: partial.append(m["loss"]))
    assert partial == kept
    with pytest.raises(tandem.Error, match="--recompute-blocks 2 says how many blocks recompute"):
        tandem.TrainConfig(recompute_blocks=2)
    # "auto": the fewest that fit the bound; a roomy one needs none, so the same losses.
    chosen = tandem.TrainConfig(**config_dict(corpus), recompute="unit", recompute_blocks="auto",
                                mem_limit="1GiB")
    assert chosen.recompute_blocks == "auto"
    fitted = []
    tandem.Trainer(chosen).train(callback=lambda m: fitted.append(m["loss"]))
    assert fitted == kept
    with pytest.raises(tandem.Error, match="--recompute-blocks auto says how many blocks"):
        tandem.TrainConfig(recompute_blocks="auto")
    with pytest.raises(tandem.Error, match="must be a number of blocks or \"auto\""):
        tandem.TrainConfig(recompute="unit", recompute_blocks="most")
    with pytest.raises(tandem.Error, match="--recompute must be none, attention or unit"):
        tandem.TrainConfig(recompute="blocks")
    assert tandem.TrainConfig(loss_chunk=8).loss_chunk == 8
    with pytest.raises(tandem.Error, match="--loss-chunk must not be negative"):
        tandem.TrainConfig(loss_chunk=-1)


def test_reduce_dtype_is_checked_saved_and_resumed(tmp_path, corpus):
    assert tandem.TrainConfig().reduce_dtype == "f32"
    with pytest.raises(tandem.Error, match="--reduce-dtype must be f32 or bf16, got 'f16'"):
        tandem.TrainConfig(reduce_dtype="f16")
    config = tandem.TrainConfig(**config_dict(corpus, steps=2, save=str(tmp_path / "ck")),
                                reduce_dtype="bf16")
    assert config.reduce_dtype == "bf16"
    tandem.Trainer(config).train()
    resumed = tandem.Trainer.resume(tmp_path / "ck", steps=3)
    assert resumed.config.reduce_dtype == "bf16"  # the checkpoint's options, read back


def test_cuda_graph_is_a_cuda_switch():
    assert tandem.TrainConfig().cuda_graph == "auto"
    with pytest.raises(tandem.Error, match="--cuda-graph .* it needs --device cuda"):
        tandem.TrainConfig(cuda_graph=True)
    with pytest.raises(tandem.Error, match="--cuda-graph .* it needs --device cuda"):
        tandem.TrainConfig(cuda_graph="on")
    assert tandem.TrainConfig(device="cuda", cuda_graph=True).cuda_graph == "on"
    assert tandem.TrainConfig(device="cuda", cuda_graph="auto").cuda_graph == "auto"
    assert tandem.TrainConfig(cuda_graph=False).cuda_graph == "off"


def test_resume_continues_the_run_exactly(tmp_path, corpus):
    cfg = config_dict(corpus, save=str(tmp_path / "ck"))
    whole = []
    tandem.Trainer(config_dict(corpus)).train(callback=lambda m: whole.append(m["loss"]))
    first = tandem.Trainer(cfg)
    first.train(steps=4)  # saves at the end of the call
    del first
    resumed = tandem.Trainer.resume(tmp_path / "ck")
    assert resumed.steps_done == 4
    rest = []
    resumed.train(callback=lambda m: rest.append(m["loss"]))
    assert rest == whole[4:]
    further = tandem.Trainer.resume(tmp_path / "ck", steps=8)
    assert further.config.steps == 8 and further.steps_done == 6


@pytest.mark.parametrize("bad", [{"lr": 20}, {"bogus": 1}, {"strategy": "zero9"},
                                 {"batch": "four"}, {"warmup": 50}])
def test_a_bad_config_raises_the_commands_message(tmp_path, corpus, bad):
    cfg = config_dict(corpus, **bad)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(cfg))
    r = run_cli("train", "--config", path, check=False)
    assert r.returncode != 0
    with pytest.raises(tandem.Error) as e:
        tandem.Trainer(tandem.TrainConfig(**cfg))
    assert e.value.message and e.value.message in r.stderr
    assert e.value.rank == 0 and e.value.call
    assert str(e.value) == e.value.message


def test_a_missing_data_file_raises_before_any_step(tmp_path):
    with pytest.raises(tandem.Error, match="nope.tok"):
        tandem.Trainer(tandem.TrainConfig(model="gpt2-tiny", data=str(tmp_path / "nope.tok")))


def test_config_reads_back_and_refuses_the_commands_own_keys(corpus):
    c = tandem.TrainConfig(model="gpt2-tiny", data=str(corpus), global_batch=8,
                           **{"weight-decay": 0.05})
    assert c.global_batch == 8 and c.weight_decay == 0.05 and c.lr == 3e-4
    assert c.replace(lr=1e-3).lr == 1e-3 and c.lr == 3e-4
    assert tandem.TrainConfig(**c.to_dict()) == c
    with pytest.raises(tandem.Error, match="hardware"):
        tandem.TrainConfig(hardware="h200-sxm")


def test_a_callback_error_ends_training_and_reaches_the_caller(corpus):
    t = tandem.Trainer(config_dict(corpus))

    def boom(m):
        if m["step"] == 2:
            raise ValueError("stop here")

    with pytest.raises(ValueError, match="stop here"):
        t.train(callback=boom)
    assert t.steps_done == 2


def test_steps_run_without_the_gil(corpus):
    t = tandem.Trainer(config_dict(corpus, steps=3))
    count = [0]
    running = threading.Event()
    done = threading.Event()

    def spin():
        running.set()
        while not done.is_set():
            count[0] += 1

    th = threading.Thread(target=spin)
    th.start()
    running.wait()
    before = count[0]
    t.train()  # no callback: the whole run is C++
    after = count[0]
    done.set()
    th.join()
    assert after > before  # the thread ran while the steps did


SIGINT_SCRIPT = r"""
import json, os, signal, sys
import tandem
cfg = json.loads(sys.argv[1])
t = tandem.Trainer(cfg)
def on_step(m):
    if m["step"] == 2:
        os.kill(os.getpid(), signal.SIGINT)
try:
    t.train(callback=on_step)
    print(json.dumps({"interrupted": False, "steps": t.steps_done}))
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True, "steps": t.steps_done}))
"""


def test_ctrl_c_stops_at_a_step_boundary_and_saves(tmp_path, corpus):
    cfg = config_dict(corpus, save=str(tmp_path / "ck"))
    r = subprocess.run([sys.executable, "-c", SIGINT_SCRIPT, json.dumps(cfg)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out == {"interrupted": True, "steps": 2}
    assert tandem.model_info(str(tmp_path / "ck"))["checkpoint_step"] == 2


MPI_SCRIPT = r"""
import json, sys
import tandem
cfg = json.loads(sys.argv[1])
t = tandem.Trainer(cfg)
losses = []
t.train(callback=lambda m: losses.append(m["loss"]))
if t.rank == 0:
    with open(sys.argv[2], "w") as f:
        json.dump({"world": t.world_size, "losses": losses}, f)
"""


def test_mpirun_two_ranks_equals_one(tmp_path, corpus):
    mpirun = "mpirun"
    # The same global batch: 2 ranks x batch 2 against 1 rank x batch 4.
    one = []
    tandem.Trainer(config_dict(corpus, batch=4)).train(callback=lambda m: one.append(m["loss"]))
    cfg = config_dict(corpus, batch=2, **{"global-batch": 4})
    out = tmp_path / "two.json"
    cmd = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x", "PYTHONPATH",
           "-x", "OMP_NUM_THREADS", sys.executable, "-c", MPI_SCRIPT, json.dumps(cfg), str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    two = json.loads(out.read_text())
    assert two["world"] == 2
    assert len(two["losses"]) == len(one)
    # Sharded gradients are reduced in another order: equal to fp32 rounding over the steps.
    for a, b in zip(two["losses"], one):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-6)
