// The one composition of the model's units: forward and backward of the embedding, a
// block and the head, written once against the kernel table (device/kernels.h) from the
// model's description (model/config.h). Every device runs exactly this code; a family is
// a description, a device is a kernel table.
#pragma once

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

// Runs unit u forward. The embedding reads ws.tokens; the head writes ws.logits.
void unit_forward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                  Workspace& ws);
// Runs unit u backward, adding parameter gradients into grads. The head starts the
// backward: the fused cross-entropy turns the logits into dlogits (writing ws.losses),
// scaled by dloss, the gradient of the objective with respect to each token's loss
// (1 / tokens per optimizer step for a mean). On entry to a block ws.dres holds
// d(block output); on exit d(block input).
void unit_backward(Kernels& k, const ModelLayout& model, int u, const UnitParams& params,
                   const UnitGrads& grads, Workspace& ws, float dloss);

// Whole-model helpers for one micro-batch.
void model_forward(Kernels& k, const ModelLayout& model, const UnitParams& params, Workspace& ws);
void model_backward(Kernels& k, const ModelLayout& model, const UnitParams& params,
                    const UnitGrads& grads, Workspace& ws, float dloss);

// Throws naming the first id outside [0, vocab) and its position.
void check_token_ids(const int32_t* ids, size_t n, int vocab, const char* what);

}  // namespace tandem
