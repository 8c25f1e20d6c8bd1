// The activation table: every tensor one micro-batch keeps or needs between the units'
// forward and backward, declared once (name, shape, dtype, lifetime). The CPU and CUDA
// executors carve their workspace from it, and the planner sizes memory from it, so the
// three always agree.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "device/kernels.h"
#include "model/config.h"

namespace tandem {

enum class ActId : uint8_t {
  residual,  // [N, C] per layer 0..L: the embedding's output, then each block's output
  norm1,     // block: the attention branch's normalised input [N, C]
  norm1_mean,
  norm1_rstd,  // [N] fp32 statistics (mean for LayerNorm only)
  qkv,         // [N, Q], q and k rotated
  att,         // attention's saved state: probabilities [B,H,T,T] or log-sum-exp [B,H,T]
  atty,        // [N, A] attention output before the projection
  xmid,        // [N, C] x + attention
  norm2,       // the MLP branch's normalised input [N, C]
  norm2_mean,
  norm2_rstd,
  fch,  // [N, M] first MLP product (pre-GELU, or [gate | up])
  act,  // [N, F] MLP activation
  normf,
  normf_mean,
  normf_rstd,
  logits,     // [N, head_rows()] (Vp, or a tensor-parallel rank's rows); dlogits after the
              // head's backward
  losses,     // [N] fp32
  dres,       // gradient scratch: d(residual stream) [N, C], updated in place unit by unit
  dnorm,      // [N, C]
  dfch,       // [N, M]
  dact,       // [N, F]
  datty,      // [N, A]
  dqkv,       // [N, Q]
  tokens,     // [N] int32 inputs
  targets,    // [N] int32 targets
  scratch,    // the kernel table's scratch bytes
  positions,  // inference: [N] int32 position of each row's token
  slots,      // inference: [N] int32 KV cache slot of each row's sequence
  drawn,      // decoding: [2, N] int32, the tokens of the last two steps ([Run-ahead])
};

enum class ActDType : uint8_t { compute, f32, i32, bytes };

enum class Lifetime : uint8_t {
  saved,  // written by a unit's forward, read by the same unit's backward
  // One copy shared by every block under activation recompute: each block's forward
  // writes it, and each block's backward recomputes it before reading it.
  recomputed,
  step,      // read across units in one direction (residual stream, logits, tokens)
  backward,  // gradient scratch, reused by every unit's backward
  call,      // kernel scratch, reused by every call
};

struct TensorSpec {
  ActId id;
  int layer = -1;  // block number, the residual's index, or -1
  std::vector<int64_t> shape;
  ActDType dtype = ActDType::compute;
  Lifetime lifetime = Lifetime::saved;
  std::string name() const;  // "block.3.qkv", "logits"
  int64_t numel() const;
};

// What the workspace serves. Training keeps every block's activations for the backward;
// inference keeps one block's, reused by every block, two residual buffers in turn and no
// gradients: `prefill` runs B prompts of T tokens through the blocks (no head), `decode`
// runs B single-token rows through the whole model to the logits.
enum class WorkspaceUse : uint8_t { train, prefill, decode };

// [Activation recompute] What training keeps of each block between its forward and its
// backward. `none` keeps every tensor the backward reads. `attention` keeps one copy of
// attention's state and output (att, atty) for all blocks and recomputes them from the
// saved qkv before each block's backward: the attention probabilities of the CPU's
// kernels ([B,H,T,T] per block) and the output [N,A] are no longer held per block.
// `unit` keeps only each block's input (the residual stream) and one set of block
// tensors, and runs each block's forward again before its backward. Gradients equal
// those without recompute: the same kernels recompute the same values (bitwise on CPU).
//
// [Partial recompute] Either mode may cover only the first K blocks (`recompute_blocks`,
// `--recompute-blocks K`; 0: every block): they share the one copy, and the other blocks
// keep every tensor as without recompute. Each block kept saves one forward of it in the
// step for one block's tensors of memory, so a run that needs recompute to fit recomputes
// only as many blocks as it must (`tandem plan` names that number).
enum class Recompute : uint8_t { none, attention, unit };
Recompute recompute_parse(const std::string& name);  // "none" | "attention" | "unit"
const char* recompute_name(Recompute r);
// ", recompute unit" (every block), ", recompute unit in 12 of 32 blocks", or "" for none:
// what a run's start line and a plan say.
std::string recompute_text(Recompute mode, int blocks, int n_layer);
// What block `layer` recomputes when the first `blocks` blocks do as `mode` says (every
// block when `blocks` is 0).
Recompute recompute_at(Recompute mode, int blocks, int layer);
// The fewest of `n_layer` blocks recomputing for which `fits(K)` holds, found by bisection
// (memory falls as K grows; K = 1 keeps as much as none, so the search starts at 2); 0 when
// not even every block recomputing fits. The one search the engine and the planner share.
int recompute_fewest_blocks(int n_layer, const std::function<bool(int)>& fits);

// What a device's kernels change in the table.
struct ActivationTraits {
  WorkspaceUse use = WorkspaceUse::train;
  Recompute recompute = Recompute::none;  // training only
  int recompute_blocks = 0;  // [Partial recompute]: the first this many blocks; 0: every block
  // Training only: 0, the head's forward makes the logits of every row and its backward
  // turns them into the loss; R > 0, the head's backward makes them R rows at a time, each
  // chunk's loss and gradient computed and consumed in turn, so the logits tensor holds R
  // rows instead of B x T ([Chunked loss], model/compose.cpp).
  int loss_chunk = 0;
  size_t compute_bytes = 4;  // bytes of one compute-dtype element
  AttentionSaves attention = AttentionSaves::probabilities;
  size_t scratch_bytes = 0;
  size_t alignment = 256;  // every tensor starts at a multiple of this
};

// The traits of a kernel table for a (B, T) micro-batch of this model; for inference, the
// use and the KV cache's positions P (its scratch depends on them).
ActivationTraits activation_traits(const Kernels& k, const ModelConfig& c, int B, int T,
                                   WorkspaceUse use = WorkspaceUse::train, int P = 0);
KernelShape kernel_shape(const ModelConfig& c, int B, int T);

// The KV cache of cached inference: per block, K and V as [slots, Hkv, positions, D] in the
// compute dtype (device/kernels.h, "Decoding with a KV cache").
struct KvCache {
  std::vector<void*> k, v;  // one per block
  int slots = 0, positions = 0;
  // Bytes of one block's K (or V).
  static size_t block_bytes(const ModelConfig& c, int slots, int positions, size_t compute_bytes);
};

// The table, in workspace order.
std::vector<TensorSpec> activation_table(const ModelConfig& c, int B, int T,
                                         const ActivationTraits& traits);
size_t tensor_bytes(const TensorSpec& t, const ActivationTraits& traits);
// Bytes of the whole workspace (each tensor aligned).
size_t activation_bytes(const ModelConfig& c, int B, int T, const ActivationTraits& traits);

// Pointers into one workspace, carved from the table. `void*` tensors are compute dtype.
struct Workspace {
  struct Block {
    void* norm1 = nullptr;
    float* norm1_mean = nullptr;
    float* norm1_rstd = nullptr;
    void* qkv = nullptr;
    void* att = nullptr;
    void* atty = nullptr;
    void* xmid = nullptr;
    void* norm2 = nullptr;
    float* norm2_mean = nullptr;
    float* norm2_rstd = nullptr;
    void* fch = nullptr;
    void* act = nullptr;
  };

  // storage: activation_bytes(c, B, T, traits) bytes, aligned to traits.alignment.
  Workspace(const ModelConfig& c, int B, int T, const ActivationTraits& traits, void* storage);
  // A workspace in host memory of its own (for a CPU kernel table: generation, tests).
  static std::unique_ptr<Workspace> on_host(const ModelConfig& c, int B, int T,
                                            const ActivationTraits& traits);

  int B = 0, T = 0, N = 0;
  ActivationTraits traits;
  std::vector<void*> residual;  // L + 1 entries
  std::vector<Block> blocks;
  void* normf = nullptr;
  float* normf_mean = nullptr;
  float* normf_rstd = nullptr;
  void* logits = nullptr;
  float* losses = nullptr;
  void *dres = nullptr, *dnorm = nullptr, *dfch = nullptr, *dact = nullptr, *datty = nullptr,
       *dqkv = nullptr;
  int32_t* tokens = nullptr;
  int32_t* targets = nullptr;
  void* scratch = nullptr;
  size_t scratch_bytes = 0;
  // Inference: each row's position and cache slot, and the cache (set by the decoder).
  int32_t* positions = nullptr;
  int32_t* slots = nullptr;
  const KvCache* cache = nullptr;
  int32_t* drawn = nullptr;  // decoding: [2, N], see ActId::drawn

 private:
  std::shared_ptr<void> owned_;  // on_host's memory
};

}  // namespace tandem
