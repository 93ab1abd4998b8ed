// Kernel P dumps (the forward engine's PV operand bytes, tests/support/fwd_dump_p.h) against
// the golden model's P: docs/numerics.md "GPU P codes vs the golden model" defines the classes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fp4attn/golden/golden.h"
#include "fp4attn/recipe.h"

namespace fp4attn::golden {

enum class PMatch { kEqual, kOneCode, kParamFlip, kUnderflowEdge, kOther };

// One visible key. gpu: the kernel's operand value rescaled to the golden reference
// (decoded byte * 2^shift, shift = m_run - m_final); golden: make_row_p's value. golden_grid:
// for the block-scaled P (fp4-direct, nvfp4-all) the sorted values the key's block can take
// under the golden's block parameter (p_block_grid), empty for the E4M3 P of the exp2 recipes
// and nvfp4-fast (one code is one E4M3 step); kernel_grids: the same under the kernel's block
// parameters one step from the golden's (read back from the dump's block maximum).
PMatch classify_p(double gpu, double golden, int shift, const std::vector<double>& golden_grid,
                  const std::vector<std::vector<double>>& kernel_grids);

// The distinct values (sorted) of a fp4-direct block of exponent `param` or a nvfp4-all block of
// E4M3 scale `param`, as folded E4M3 operands made at reference m_run, times 2^shift.
std::vector<double> p_block_grid(Recipe recipe, double param, int shift);

struct PDumpStats {
  // Visible keys by class.
  int64_t equal = 0, one_code = 0, param_flip = 0, underflow_edge = 0, other = 0;
  int64_t rescaled = 0;         // visible keys of blocks made with a running m != the final m
  int64_t rescaled_blocks = 0;  // (row, block) pairs with visible keys and running m != final m
  int64_t masked = 0, masked_nonzero = 0;  // keys of written blocks past the row's visible keys
  int64_t unwritten = 0;  // P bytes or m values the kernel had to write but left poisoned
  int64_t stray = 0;      // positions past the written blocks that are not poison
  int64_t bad_m = 0;      // running m not an integer, decreasing, or -inf with visible keys
  int64_t rows = 0, rows_final_m_differs = 0;  // rows with keys; kernel's last m != golden's m
  // fp4-direct / nvfp4-all blocks whose parameter the kernel chose one step from the golden's
  // (its block maximum sits on a rounding edge of the exponent or scale), and "other" keys in
  // them: under the other parameter the affine surrogate's code can move by more than one.
  int64_t flipped_blocks = 0, other_in_flipped = 0;
  std::string first_other;  // where the first "other" (or bad position) was, and its values

  int64_t compared() const { return equal + one_code + param_flip + underflow_edge + other; }
  void add(const PDumpStats& s);
  std::string summary() const;
};

// One dumped row: p its key_stride bytes (real key order), m its `blocks` running references;
// the kernel wrote blocks [0, written_blocks) of block_keys keys each and nothing else, which
// still holds `poison` (every byte). z: the golden log2 scores of the row's n visible keys
// (OperandScores::row); opt: the recipe (folded emulation). `where` prefixes first_other.
void compare_p_row(const uint8_t* p, const float* m, int64_t block_keys, int64_t blocks,
                   int64_t written_blocks, uint8_t poison, const std::vector<double>& z, int64_t n,
                   const RecipeOptions& opt, const std::string& where, PDumpStats* st);

}  // namespace fp4attn::golden
