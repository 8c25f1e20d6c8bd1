// PCRE2 (8-bit, UTF + UCP, JIT) behind tandem::Regex. Match data and the JIT stack are per
// thread, so one compiled pattern serves all the threads of `tandem data prepare`.
#include "io/regex.h"

#include "core/error.h"

#if TANDEM_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif

namespace tandem {

#if TANDEM_HAVE_PCRE2

struct Regex::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  std::string where;
};

namespace {

// Per thread: one match block (one pair of offsets is all we read) and a JIT stack large
// enough for long whitespace runs under look-ahead.
struct ThreadMatch {
  pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
  pcre2_jit_stack* stack = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, nullptr);
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  ThreadMatch() { pcre2_jit_stack_assign(context, nullptr, stack); }
  ~ThreadMatch() {
    pcre2_match_context_free(context);
    pcre2_jit_stack_free(stack);
    pcre2_match_data_free(data);
  }
};

std::string pcre2_message(int code) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(code, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

}  // namespace

Regex::Regex(const std::string& pattern, const std::string& where) : impl_(new Impl) {
  impl_->where = where;
  int err = 0;
  PCRE2_SIZE at = 0;
  impl_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                              PCRE2_UTF | PCRE2_UCP, &err, &at, nullptr);
  TD_CHECK(impl_->code != nullptr, "{}: bad regular expression at offset {}: {}", where, at,
           pcre2_message(err));
  impl_->jit = pcre2_jit_compile(impl_->code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() {
  if (impl_ && impl_->code) pcre2_code_free(impl_->code);
}

bool Regex::available() {
  return true;
}

void Regex::for_each_match(std::string_view text,
                           const std::function<void(size_t, size_t)>& on_match) const {
  thread_local ThreadMatch m;
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0;
  while (start < text.size()) {
    const int rc =
        impl_->jit ? pcre2_jit_match(impl_->code, subject, text.size(), start, 0, m.data, m.context)
                   : pcre2_match(impl_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                                 m.data, m.context);
    if (rc == PCRE2_ERROR_NOMATCH) return;
    TD_CHECK(rc >= 0, "{}: matching failed: {}", impl_->where, pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(m.data);
    const size_t b = ov[0], e = ov[1];
    if (e > b) {
      on_match(b, e);
      start = e;
    } else {
      // An empty match: step over one whole character.
      start = b + 1;
      while (start < text.size() && (static_cast<uint8_t>(text[start]) & 0xC0) == 0x80) ++start;
    }
  }
}

#else

struct Regex::Impl {};

Regex::Regex(const std::string& pattern, const std::string& where) {
  TD_THROW(
      "{}: this tokenizer needs regular expressions, and this build of tandem has no PCRE2: "
      "install libpcre2-dev (scripts/install-deps.sh) and rebuild",
      where);
}

Regex::~Regex() = default;

bool Regex::available() {
  return false;
}

void Regex::for_each_match(std::string_view, const std::function<void(size_t, size_t)>&) const {}

#endif

}  // namespace tandem
