// Tensor parallelism over `ways` ranks: what one rank's model is, and how its parameters
// are cut from the whole model's. A rank keeps n_head / ways query heads (and the key and
// value heads they read), d_ff / ways MLP columns and head_rows() rows of the head; the
// embedding and the norms stay whole. Its attention and MLP output products then give
// partial sums, which the ranks all-reduce (model/compose.h, tp_reduce_after); only the
// lead rank adds the residual and the output biases, so the sum counts them once.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.h"
#include "model/model.h"

namespace tandem {

// Throws, naming the numbers, unless the model splits `ways` ways: the query heads and
// d_ff divisible by ways, and the key/value heads either divisible by ways (each rank
// keeps n_kv_head / ways of them) or dividing ways (each rank keeps the one its query
// heads read).
void tp_check(const ModelConfig& c, int ways);

// The config of rank `rank` of `ways`: n_head / ways query heads, n_kv_head / ways key and
// value heads (or 1), d_ff / ways, head_size the whole model's head_dim(), tp = {ways,
// rank}. Vocabulary, d_model, context and the description are those of `c`; with ways == 1
// it is `c` itself.
ModelConfig tp_local_config(const ModelConfig& c, int ways, int rank);

// A run of the whole model's unit flat buffer, [begin, begin + count), or `count` zeros.
struct TpPiece {
  int64_t begin = 0, count = 0;
  bool zeros = false;
};

// Unit `unit` of the rank's model (`local`, from tp_local_config of `global`'s config) as
// pieces of the same unit of the whole model: concatenated, the pieces are the rank's
// unpadded flat buffer, parameter by parameter in its layout's order. Adjacent pieces are
// merged. The cuts (weights are [out, in], row-major):
//   qkv_w, qkv_b  the rows of the rank's query heads, then its key heads', then its value
//                 heads';
//   proj_w        columns [r A/ways, (r + 1) A/ways) of every row (A = n_head head_dim);
//   fc_w, fc_b    rows [r F/ways, (r + 1) F/ways) (SwiGLU: those of the gate, then those
//                 of the up half, F further on);
//   fc2_w         columns [r F/ways, (r + 1) F/ways) of every row;
//   proj_b, fc2_b whole on the lead rank, zeros on the others;
//   head_w        rows [head_begin, head_begin + head_rows), zeros past vocab_padded;
//   norms, wte, wpe whole (a tied head reads the whole wte of unit 0).
std::vector<TpPiece> tp_unit_pieces(const ModelLayout& global, const ModelLayout& local, int unit);

// The pieces of a whole unit buffer (at least its unpadded elements), concatenated.
std::vector<float> tp_cut(const std::vector<float>& global_unit,
                          const std::vector<TpPiece>& pieces);

// Elements the pieces describe.
int64_t tp_pieces_numel(const std::vector<TpPiece>& pieces);

}  // namespace tandem
