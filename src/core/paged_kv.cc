// Names of the paged KV cache's formats and device error flags (paged_kv.h).
#include "fp4attn/paged_kv.h"

namespace fp4attn {

const char* kv_cache_format_name(KvCacheFormat f) {
  switch (f) {
    case KvCacheFormat::kNvfp4:
      return "nvfp4";
    case KvCacheFormat::kFp8:
      return "fp8";
  }
  return "unknown";
}

const char* paged_error_description(PagedError e) {
  switch (e) {
    case kPagedErrorSlotPastCache:
      return "slot_mapping: a slot >= num_pages * page_size (the token was not written)";
    case kPagedErrorSeqLen:
      return "seq_lens: a length outside [0, max_pages * page_size] (its rows are NaN)";
    case kPagedErrorPageId:
      return "block_tables: a page id outside [0, num_pages) (its sequence's rows are NaN)";
    case kPagedErrorCuSeqlens:
      return "cu_seqlens_q: offsets outside [0, total_q], decreasing, or not from 0 to total_q";
  }
  return "unknown paged error";
}

}  // namespace fp4attn
