// Fault injection for the failure tests: the spec "<rank>:<point>:<action>" makes the
// process of that world rank exit (std::_Exit(3)) or hang (sleep forever) when it reaches
// the named point: "step<N>" (inside the compute of optimizer step N, counted from 1 as in the
// metrics) or "save" (after its checkpoint shard is durable, before the index is written).
// The action "nan" at "step<N>" instead poisons that rank's gradients of step N with a NaN
// (the CPU engine asks fault_nan before the gradient norm).
// The tandem command arms the spec of TANDEM_FAULT (api/environment.h) at startup; unarmed,
// a point costs one check.
#pragma once

#include <cstdint>
#include <string>

namespace tandem {

// Arms the fault of `spec` for this process, replacing any armed before; an empty or
// malformed spec, or one whose action is neither exit nor hang, arms nothing.
void fault_configure(const std::string& spec);

// point: "step" with the step number, or "save" (number ignored).
void fault_point(const std::string& point, int64_t number);

// Whether the armed fault is "nan" at `point` `number` for this rank; says so on stderr.
bool fault_nan(const std::string& point, int64_t number);

}  // namespace tandem
