// The one composition of the model's units: forward and backward of the embedding, a
// block and the head, written once against the kernel table (device/kernels.h) from the
// model's description (model/config.h). Every device runs exactly this code; a family is
// a description, a device is a kernel table.
#pragma once

#include <cstdint>
#include <vector>

#include "device/kernels.h"
#include "model/activations.h"
#include "model/model.h"

namespace tandem {

// Gathered parameters by unit index: params[u] is unit u's flat buffer in the compute
// dtype; a unit reads its own buffer and those of ModelLayout::reads(u).
using UnitParams = std::vector<const void*>;
// fp32 unsharded gradient buffers by unit index (null where not written).
using UnitGrads = std::vector<float*>;

// Runs unit u forward. The embedding reads ws.tokens; the head writes ws.logits, [N,
// head_rows()]: the whole padded vocabulary, or a tensor-parallel rank's rows of it.
void unit_forward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                  Workspace& ws);

// A block in two halves, for a tensor-parallel rank that all-reduces between them:
// `attention` runs everything up to and including xmid, `mlp` the rest (it writes the
// block's output). Other units run `whole` only.
enum class BlockPart { whole, attention, mlp };
// unit_forward(..., part). A tensor-parallel rank (model.config().tp.ways > 1) computes
// partial sums: its heads' and its MLP columns' share of each output product, the
// residual and the output biases added on the lead rank only (model/tensor_parallel.h). A
// sequential block of such a rank runs in parts, since xmid is reduced in the middle.
void unit_forward_part(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                       Workspace& ws, BlockPart part);

// The buffer a tensor-parallel rank sums over the ranks (an all-reduce) after running a
// part of unit u, and its element count in the compute dtype; {nullptr, 0} when nothing is
// reduced. A sequential block: xmid [N, C] after `attention`, the block output [N, C] after
// `mlp`; a parallel block: nothing after `attention` (xmid holds the rank's attention
// partial sum, which its MLP part adds to), the block output after `mlp` (or `whole`).
// With ways == 1 (one model, nothing to sum) always {nullptr, 0}.
struct TpReduce {
  void* buf = nullptr;
  int64_t count = 0;
};
TpReduce tp_reduce_after(const ModelLayout& model, int u, BlockPart part, Workspace& ws);
// Runs unit u backward, adding parameter gradients into grads. The head starts the
// backward: the fused cross-entropy turns the logits into dlogits (writing ws.losses),
// scaled by dloss, the gradient of the objective with respect to each token's loss
// (1 / tokens per optimizer step for a mean). On entry to a block ws.dres holds
// d(block output); on exit d(block input).
//
// [Fresh gradients] fresh[g] (by unit index; shorter than the unit list: false) says this
// backward is the first writer of unit g's gradient buffer in the step, whose contents may
// be anything. It leaves each of unit g's numel elements as adding into zeros would: the
// linear and norm backwards write (GradMode::write), and what no kernel writes whole is
// cleared first (Kernels::zero): an embedding's whole buffer (its token rows are scattered
// and added) and, behind a tied head, the embedding's elements other than wte. A buffer's
// padding past numel is the caller's to clear.
void unit_backward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                   const UnitGrads& grads, Workspace& ws, float dloss,
                   const std::vector<bool>& fresh = {});

// Whole-model helpers for one micro-batch.
void model_forward(Kernels& k, const ModelLayout& model, const UnitParams& params, Workspace& ws);
void model_backward(Kernels& k, const ModelLayout& model, const UnitParams& params,
                    const UnitGrads& grads, Workspace& ws, float dloss);

// Throws naming the first id outside [0, vocab) and its position.
void check_token_ids(const int32_t* ids, size_t n, int vocab, const char* what);

}  // namespace tandem
