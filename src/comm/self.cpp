// The one-rank communicator: the world of a process not started by an MPI launcher, so a
// plain `tandem train` never initialises MPI. Every collective over one rank is a copy
// (or nothing, in place), submitted to the stream so it stays ordered with other work.
#include <cstring>

#include "comm/comm_internal.h"
#include "comm/communicator.h"
#include "core/error.h"

namespace tandem {

namespace {

class SelfCommunicator final : public Communicator {
 public:
  SelfCommunicator(Device& device, std::string name) : device_(device), name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }

  void all_gather(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    copy(s, "all-gather", label, send, recv, count, dtype);
  }
  void reduce_scatter(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                      const std::string& label) override {
    copy(s, "reduce-scatter", label, send, recv, count, dtype);
  }
  void all_reduce(Stream& s, const void* send, void* recv, size_t count, DType dtype,
                  const std::string& label) override {
    copy(s, "all-reduce", label, send, recv, count, dtype);
  }
  void broadcast(Stream& s, void* buf, size_t count, DType dtype, int root,
                 const std::string& label) override {
    comm_check_root(*this, root, label);
    const size_t bytes = comm_total(*this, "broadcast", label, count, dtype_size(dtype));
    comm_check_buffers(*this, "broadcast", label, {buf, bytes, buf, bytes}, true);
  }
  void barrier(Stream& s, const std::string& label) override {}
  // One rank has no peer: comm_check_peer refuses every call.
  void send(Stream& s, const void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    comm_check_peer(*this, "send", peer, label);
  }
  void recv(Stream& s, void* buf, size_t count, DType dtype, int peer,
            const std::string& label) override {
    comm_check_peer(*this, "recv", peer, label);
  }

  std::unique_ptr<Communicator> duplicate(const std::string& name) const override {
    return std::make_unique<SelfCommunicator>(device_, name);
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) const override {
    TD_CHECK(color >= 0, "split of communicator {} into {}: color {} is negative", name_, name,
             color);
    return std::make_unique<SelfCommunicator>(device_, name);
  }

 private:
  // With one rank every reduction is the identity: recv = send.
  void copy(Stream& s, const char* op, const std::string& label, const void* send, void* recv,
            size_t count, DType dtype) {
    const size_t bytes = comm_total(*this, op, label, count, dtype_size(dtype));
    comm_check_buffers(*this, op, label, {send, bytes, recv, bytes}, send == recv);
    if (bytes == 0 || send == recv) return;
    // On CUDA, submit runs the closure on the host at once: a memcpy of device pointers
    // would crash, so refuse clearly until the device interface has an async copy.
    TD_CHECK(device_.kind() == DeviceKind::cpu,
             "{} '{}' on the one-rank communicator {} needs a copy, which is supported on the "
             "cpu device only",
             op, label, name_);
    device_.submit(s, [send, recv, bytes] { std::memcpy(recv, send, bytes); });
  }

  Device& device_;
  const std::string name_;
};

}  // namespace

std::unique_ptr<Communicator> comm_self(Device& device, const std::string& name) {
  return std::make_unique<SelfCommunicator>(device, name);
}

}  // namespace tandem
