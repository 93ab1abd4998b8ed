#include "progress.h"

namespace fp4attn::cli {

void Progress::next(const std::string& what) {
  ++done_;
  if (quiet_) return;
  std::fprintf(out_, "[%lld/%lld] %s\n", static_cast<long long>(done_),
               static_cast<long long>(total_), what.c_str());
  std::fflush(out_);
}

}  // namespace fp4attn::cli
