# Runs the fp4attn executable (-DFP4ATTN=path) and checks exit codes and messages: bad flags and
# impossible shapes give a one-line error naming the flag and exit code 2; --help works; every
# command's --json document parses and carries the head (revision, device, date, command,
# backend, version); [i/N] progress goes to stderr only and --quiet silences it; --version; and
# tools/build_info.cmake's revision on scratch git repositories.

cmake_minimum_required(VERSION 3.25)

function(expect_run expected_rc expected_text)
  execute_process(COMMAND ${FP4ATTN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL expected_rc)
    message(FATAL_ERROR "fp4attn ${ARGN}: exit code ${rc}, expected ${expected_rc}\n${out}${err}")
  endif()
  string(FIND "${out}${err}" "${expected_text}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "fp4attn ${ARGN}: output lacks '${expected_text}':\n${out}${err}")
  endif()
  if(expected_rc EQUAL 2)
    # One line on stderr, nothing on stdout.
    string(REGEX MATCHALL "\n" lines "${err}")
    list(LENGTH lines n)
    if(NOT n EQUAL 1 OR NOT out STREQUAL "")
      message(FATAL_ERROR "fp4attn ${ARGN}: expected a one-line error, got:\n${out}${err}")
    endif()
  endif()
endfunction()

expect_run(0 "Commands:" --help)
expect_run(0 "--seqlen-q" run --help)
expect_run(0 "--query-tokens" decode --help)
expect_run(0 "rel_l2" decode --backend cpu --batch 2 --heads 4 --kv-heads 2 --context 100
           --query-tokens 2 --head-dim 64 --page-size 16)
expect_run(0 "near-uniform  fp8" decode --backend cpu --batch 1 --heads 4 --kv-heads 2 --context 64
           --head-dim 64 --input all)
expect_run(2 "--input: expected gaussian, outliers, large-logits, near-uniform or all, got 'zeros'"
           decode --input zeros)
expect_run(2 "--format: expected nvfp4, fp8 or all, got 'int4'" decode --format int4)
expect_run(2 "--query-tokens: 9 is more than --context 8" decode --context 8 --query-tokens 9)
expect_run(2 "--backend: expected auto, gpu or cpu" decode --backend tpu)
expect_run(0 "nvfp4-hx" recipes)
expect_run(0 "usage: fp4attn recipes" recipes --help)
expect_run(2 "missing command")
expect_run(2 "unknown command 'frobnicate'" frobnicate)
expect_run(2 "unknown flag --bogus" run --bogus)
expect_run(2 "--head-dim: expected 64 or 128, got 96" run --head-dim 96)
expect_run(2 "--heads: 6 is not a multiple of --kv-heads 4" run --heads 6 --kv-heads 4)
expect_run(2 "--heads: expected an integer in [1, 4096], got 'x'" run --heads x)
expect_run(2 "--seqlen-q: expected an integer" run --seqlen-q -5)
expect_run(2 "--recipe: unknown recipe 'fp3'" run --recipe fp3)
expect_run(2 "--input: expected gaussian" run --input pink)
expect_run(2 "--batch: expected a value" run --batch)
expect_run(2 "--causal: takes no value" run --causal=yes)
expect_run(2 "--softmax-scale: expected a value > 0" run --softmax-scale -1)
expect_run(2 "--emulation: expected folded or exact" run --emulation fast)
# A small real run prints the accuracy table row of the recipe.
expect_run(0 "nvfp4" run --heads 1 --seqlen-q 70 --seqlen-k 90 --head-dim 64 --recipe nvfp4 --causal)
# fp4attn grad: a tiny shape prints one row per recipe and input; bad flags name themselves.
expect_run(0 "--d-source" grad --help)
expect_run(0 "fp8         near-uniform" grad --recipe fp8 --input all --seqlen 64 --heads 2
           --head-dim 64)
expect_run(0 "bf16        gaussian      refused: arithmetic" grad --recipe bf16 --seqlen 32
           --heads 1 --head-dim 64)
expect_run(2 "--recipe: unknown recipe 'fp3'" grad --recipe fp3)
expect_run(2 "--d-source: expected forward-o or high-precision-o, got 'exact-o'" grad
           --d-source exact-o)
expect_run(2 "--arithmetic: expected fp8 or f64, got 'fp16'" grad --arithmetic fp16)
expect_run(0 "non-causal, smooth-k" grad --recipe fp8 --seqlen 32 --heads 1 --head-dim 64
           --smooth-k)
expect_run(2 "--smooth-k: takes no value" grad --smooth-k=1)
expect_run(0 "dS scales per tile" grad --recipe fp8 --seqlen 32 --heads 1 --head-dim 64)
expect_run(0 "dS scales per head" grad --recipe fp8 --seqlen 32 --heads 1 --head-dim 64
           --ds-scales per-head)
expect_run(2 "--ds-scales: expected per-head or per-tile, got 'per-row'" grad --ds-scales per-row)
# -h is --help.
expect_run(0 "--seqlen-q" run -h)

# Sizes (issue 26): a product of flags that overflows int64, a flag past int32's range and a
# problem too large for host memory are one-line errors naming the flags, not a crash or abort.
function(expect_absent text)
  execute_process(COMMAND ${FP4ATTN} ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  string(FIND "${out}${err}" "${text}" pos)
  if(NOT rc EQUAL 0 OR NOT pos EQUAL -1)
    message(FATAL_ERROR "fp4attn ${ARGN}: exit code ${rc}, or output has '${text}':\n${out}${err}")
  endif()
endfunction()
expect_run(2 "q elements: --batch * --seqlen-q * --heads * --head-dim = 1048576 * 33554432 * 4096 \
* 128 overflows int64" run --batch 1048576 --heads 4096 --seqlen-q 33554432 --head-dim 128
           --recipe bf16)
expect_run(2 "--seqlen-q: expected an integer in [0, 2147483647], got '2147483648'" run
           --seqlen-q 2147483648)
expect_run(2 "--seqlen: expected an integer in [0, 2147483647]" grad --seqlen 2147483648)
expect_run(2 "need 4294967297 cache slots, more than int32 slot indices address" decode
           --batch 256 --context 16777216 --page-size 1 --heads 8 --kv-heads 8)
# The memory limit is the machine's; a stated one (1 GiB) makes these refusals the same anywhere.
set(ENV{FP4ATTN_HOST_MEMORY_LIMIT} 1073741824)
expect_run(2 "the host buffers need 225.56 GiB, more than the 1.00 GiB of host memory allowed" run
           --batch 16 --heads 64 --seqlen-q 65536)
expect_run(2 "--batch, --context, --page-size, --heads, --kv-heads, --head-dim: the host buffers"
           decode --batch 64 --context 1048576 --page-size 16 --heads 8 --kv-heads 8)
expect_run(2 "--batch, --heads, --seqlen, --head-dim: the host buffers" grad --seqlen 65536
           --heads 64 --recipe fp8)
expect_run(2 "--batch, --heads, --seqlen, --head-dim: the host buffers" emulation --seqlen 1048576
           --heads 64)
unset(ENV{FP4ATTN_HOST_MEMORY_LIMIT})
# Memory the machine refuses past the check (here a 300 MB address-space limit, below the first
# 512 MB buffer; the problem's 3.5 GB pass the check on any CI machine) is still one line and exit
# code 2: main() turns every exception into one (it aborted with rc 134).
find_program(SH sh)
if(SH)
  execute_process(
    COMMAND ${SH} -c "ulimit -v 300000 && exec \"$0\" \"$@\"" ${FP4ATTN} run --batch 1 --heads 8
            --seqlen-q 131072 --head-dim 128 --recipe bf16
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  string(REGEX MATCHALL "\n" lines "${err}")
  list(LENGTH lines n)
  # The bad_alloc line (or, on a machine with less than 3.5 GB, the up-front refusal).
  if(NOT rc EQUAL 2 OR NOT n EQUAL 1 OR NOT err MATCHES "^fp4attn run: (out of host memory|--batch)")
    message(FATAL_ERROR "run under ulimit -v: exit code ${rc}, expected 2 and one line:\n${err}")
  endif()
endif()
# Empty problems print n/a, not a perfect cos of 1.
expect_run(0 "n/a" run --batch 0 --recipe bf16)
expect_absent("1.00000" run --batch 0 --recipe bf16)
expect_run(0 "n/a" run --seqlen-q 0 --recipe fp8 --heads 1 --head-dim 64)
expect_run(0 "n/a" grad --batch 0 --recipe fp8)
expect_run(0 "n/a" emulation --seqlen 0 --recipe nvfp4)
# dS scales belong to the FP8 arithmetic; with float64 they mean nothing and are refused.
expect_run(2 "--ds-scales: applies to --arithmetic fp8 only" grad --arithmetic f64 --ds-scales
           per-head)
expect_run(0 "float64 backward" grad --arithmetic f64 --recipe fp8 --seqlen 32 --heads 1
           --head-dim 64)

# --json goes through the one JSON writer (tools/common/json_writer.h): the files parse, and the
# recorded command is the command line, quoted where a shell needs it.
set(json_dir "${CMAKE_CURRENT_BINARY_DIR}/cli json")
file(MAKE_DIRECTORY "${json_dir}")
# Strict JSON where python3 is found (its json module, NaN and Infinity refused), CMake's parser
# otherwise.
find_program(PYTHON3 python3)
function(read_json var path)
  file(READ "${path}" text)
  string(JSON suite GET "${text}" suite)  # fails the script when the file is not JSON
  if(PYTHON3)
    execute_process(
      COMMAND ${PYTHON3} -c "import json, sys
def bad(c): raise ValueError('not JSON: ' + c)
json.load(open(sys.argv[1]), parse_constant=bad)" "${path}"
      RESULT_VARIABLE rc ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "${path} is not strict JSON: ${err}")
    endif()
  endif()
  set(${var} "${text}" PARENT_SCOPE)
endfunction()
function(expect_equal what got expected)
  if(NOT "${got}" STREQUAL "${expected}")
    message(FATAL_ERROR "${what}: got '${got}', expected '${expected}'")
  endif()
endfunction()

# --version: the version (python/fp4attn/_version.py's) and the revision this binary was built
# from; the head of every document below carries the same two.
execute_process(COMMAND ${FP4ATTN} --version RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT err STREQUAL ""
   OR NOT out MATCHES "^fp4attn ([A-Za-z0-9._+-]+) \\(revision ([A-Za-z0-9._+-]+); [^\n]+\\)\n$")
  message(FATAL_ERROR "fp4attn --version: exit code ${rc}, got:\n${out}${err}")
endif()
set(cli_version "${CMAKE_MATCH_1}")
set(cli_revision "${CMAKE_MATCH_2}")
get_filename_component(source_dir "${CMAKE_CURRENT_LIST_DIR}/../.." ABSOLUTE)
file(STRINGS "${source_dir}/python/fp4attn/_version.py" line REGEX "^__version__")
if(NOT line MATCHES "\"${cli_version}\"")
  message(FATAL_ERROR "fp4attn --version says ${cli_version}, python/fp4attn/_version.py: ${line}")
endif()
# Built from this checkout: git's HEAD (unless $FP4ATTN_REVISION named another).
find_program(GIT git)
if(GIT AND "$ENV{FP4ATTN_REVISION}" STREQUAL "")
  execute_process(COMMAND ${GIT} -C ${source_dir} rev-parse --show-toplevel --short=12 HEAD
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET)
  string(REPLACE "\n" ";" out "${out}")
  list(LENGTH out n)
  if(rc EQUAL 0 AND n GREATER_EQUAL 2)  # else the source is not a git checkout: skipped
    list(GET out 0 top)
    list(GET out 1 head)
    file(REAL_PATH "${top}" top)
    file(REAL_PATH "${source_dir}" src)
    if(top STREQUAL src AND NOT cli_revision MATCHES "^${head}(-dirty)?$")
      message(FATAL_ERROR "fp4attn --version: revision ${cli_revision}, the checkout is \
at ${head} (a binary older than the last commit: rebuild it)")
    endif()
  endif()
endif()
expect_run(2 "fp4attn --version: takes no arguments" --version extra)

# The head of every document (tools/cli_output.h): DESIGN.md's keys first and in its order,
# this binary's revision and version, the CPU ("cpu: <model>", these runs are --backend cpu or
# golden-only), a UTC date taken during this script, the command line.
string(TIMESTAMP cli_start "%Y-%m-%dT%H:%M:%SZ" UTC)
function(expect_head doc want_suite want_command)
  # The top-level keys as written (CMake's parser sorts them): one per line, indented by two.
  string(REGEX MATCHALL "\n  \"[a-z_]+\":" keys "${doc}")
  string(REGEX REPLACE "\n  \"([a-z_]+)\":" "\\1" keys "${keys}")
  list(SUBLIST keys 0 7 head)
  expect_equal("${want_suite} --json: first keys" "${head}"
               "suite;revision;device;date;command;backend;version")
  foreach(key suite revision device date command backend version)
    string(JSON ${key} GET "${doc}" ${key})
  endforeach()
  expect_equal("${want_suite} --json: suite" "${suite}" "${want_suite}")
  expect_equal("${want_suite} --json: revision" "${revision}" "${cli_revision}")
  expect_equal("${want_suite} --json: version" "${version}" "${cli_version}")
  expect_equal("${want_suite} --json: backend" "${backend}" cpu)
  expect_equal("${want_suite} --json: command" "${command}" "${want_command}")
  if(NOT device MATCHES "^cpu: .")
    message(FATAL_ERROR "${want_suite} --json: device '${device}', expected 'cpu: <model>'")
  endif()
  string(TIMESTAMP now "%Y-%m-%dT%H:%M:%SZ" UTC)
  set(d2 "[0-9][0-9]")
  if(NOT date MATCHES "^${d2}${d2}-${d2}-${d2}T${d2}:${d2}:${d2}Z$" OR date STRLESS cli_start
     OR date STRGREATER now)
    message(FATAL_ERROR
            "${want_suite} --json: date '${date}', expected one in [${cli_start}, ${now}]")
  endif()
endfunction()

expect_run(0 "fp8" run --backend cpu --heads 1 --seqlen-q 32 --head-dim 64 --recipe fp8 --input all
           --json "${json_dir}/run.json")
read_json(run "${json_dir}/run.json")
expect_head("${run}" accuracy "fp4attn run --backend cpu --heads 1 --seqlen-q 32 --head-dim 64 \
--recipe fp8 --input all --json '${json_dir}/run.json'")
string(JSON n LENGTH "${run}" records)
expect_equal("run --json: records" "${n}" 4)
string(JSON input GET "${run}" records 3 input)
expect_equal("run --json: last input" "${input}" near-uniform)
string(JSON p_zero GET "${run}" records 0 p_zero_pct)
string(JSON cos GET "${run}" records 0 cos)
if(cos LESS 0.99 OR p_zero STREQUAL "")
  message(FATAL_ERROR "run --json: implausible record ${run}")
endif()

expect_run(0 "refused" grad --recipe bf16 --seqlen 32 --heads 1 --head-dim 64
           --json "${json_dir}/grad.json")
read_json(grad "${json_dir}/grad.json")
expect_head("${grad}" grad-accuracy "fp4attn grad --recipe bf16 --seqlen 32 --heads 1 --head-dim \
64 --json '${json_dir}/grad.json'")
string(JSON refused GET "${grad}" records 0 refused)
string(JSON d GET "${grad}" shape d)
expect_equal("grad --json: shape d" "${d}" 64)
expect_run(0 "fp8" grad --recipe fp8 --seqlen 32 --heads 1 --head-dim 64 --causal
           --json "${json_dir}/grad.json")
read_json(grad "${json_dir}/grad.json")
string(JSON dq_cos GET "${grad}" records 0 dq cos)
string(JSON causal GET "${grad}" records 0 causal)
expect_equal("grad --json: causal" "${causal}" ON)

expect_run(0 "nvfp4" emulation --recipe nvfp4 --seqlen 32 --heads 1 --head-dim 64
           --json "${json_dir}/emulation.json")
read_json(emu "${json_dir}/emulation.json")
expect_head("${emu}" emulation "fp4attn emulation --recipe nvfp4 --seqlen 32 --heads 1 --head-dim \
64 --json '${json_dir}/emulation.json'")
string(JSON rel GET "${emu}" records 0 folded_vs_exact rel_l2)
string(JSON suite GET "${emu}" suite)
expect_equal("emulation --json: suite" "${suite}" emulation)

# decode --json: one record per input and format, the GPU-only figures null on the golden model.
expect_run(0 "near-uniform  fp8" decode --backend cpu --batch 1 --heads 2 --kv-heads 1 --context 40
           --head-dim 64 --input all --json "${json_dir}/decode.json")
read_json(dec "${json_dir}/decode.json")
expect_head("${dec}" decode "fp4attn decode --backend cpu --batch 1 --heads 2 --kv-heads 1 \
--context 40 --head-dim 64 --input all --json '${json_dir}/decode.json'")
string(JSON n LENGTH "${dec}" records)
expect_equal("decode --json: records" "${n}" 8)
string(JSON input GET "${dec}" records 7 input)
string(JSON format GET "${dec}" records 7 format)
expect_equal("decode --json: last record" "${input} ${format}" "near-uniform fp8")
string(JSON context GET "${dec}" records 7 context)
expect_equal("decode --json: context" "${context}" 40)
string(JSON gbps TYPE "${dec}" records 0 gbps)
string(JSON vs_golden TYPE "${dec}" records 0 vs_golden_rel_l2)
expect_equal("decode --json: the golden model's gbps and vs_golden" "${gbps} ${vs_golden}"
             "NULL NULL")
string(JSON cos GET "${dec}" records 1 cos)
if(cos LESS 0.99)
  message(FATAL_ERROR "decode --json: implausible fp8 cos ${cos}")
endif()
# A --json that cannot be written is a one-line error naming the flag (--quiet: no progress).
expect_run(2 "--json: cannot write '${json_dir}/no such dir/d.json'" decode --backend cpu --batch 1
           --heads 2 --kv-heads 1 --context 16 --head-dim 64 --quiet
           --json "${json_dir}/no such dir/d.json")

# recipes --json: one record per line of the table.
execute_process(COMMAND ${FP4ATTN} recipes --json "${json_dir}/recipes.json" OUTPUT_VARIABLE out)
read_json(rec "${json_dir}/recipes.json")
expect_head("${rec}" recipes "fp4attn recipes --json '${json_dir}/recipes.json'")
string(REGEX MATCHALL "\n" lines "${out}")
list(LENGTH lines n_recipes)
string(REGEX MATCH "^[^ ]+" first_recipe "${out}")
string(JSON n LENGTH "${rec}" records)
expect_equal("recipes --json: records" "${n}" "${n_recipes}")
string(JSON name GET "${rec}" records 2 recipe)
string(FIND "${out}" "${name} " pos)
if(NOT pos GREATER -1)
  message(FATAL_ERROR "recipes --json: record '${name}' is not in the table:\n${out}")
endif()

# Progress: commands over many cases announce each as "[i/N] <case>" on stderr, in order, never on
# stdout nor in the JSON; --quiet silences them and leaves stdout's table.
function(expect_progress n first)
  execute_process(COMMAND ${FP4ATTN} ${ARGN} --json "${json_dir}/progress.json"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "fp4attn ${ARGN}: exit code ${rc}:\n${out}${err}")
  endif()
  string(REGEX MATCHALL "[^\n]*\n" lines "${err}")
  list(LENGTH lines got)
  expect_equal("fp4attn ${ARGN}: progress lines" "${got}" "${n}")
  set(i 0)
  foreach(line IN LISTS lines)
    math(EXPR i "${i} + 1")
    if(NOT line MATCHES "^\\[${i}/${n}\\] [^\n]+\n$")
      message(FATAL_ERROR
              "fp4attn ${ARGN}: stderr line ${i} is '${line}', expected [${i}/${n}] ...")
    endif()
  endforeach()
  list(GET lines 0 line)
  expect_equal("fp4attn ${ARGN}: first progress line" "${line}" "[1/${n}] ${first}\n")
  file(READ "${json_dir}/progress.json" doc)
  foreach(text IN ITEMS "${out}" "${doc}")
    if(text MATCHES "\\[[0-9]+/${n}\\]")
      message(FATAL_ERROR "fp4attn ${ARGN}: progress outside stderr:\n${text}")
    endif()
  endforeach()
  execute_process(COMMAND ${FP4ATTN} ${ARGN} --quiet RESULT_VARIABLE rc OUTPUT_VARIABLE quiet_out
                  ERROR_VARIABLE err)
  string(REGEX MATCHALL "\n" lines "${quiet_out}")
  list(LENGTH lines quiet_lines)
  string(REGEX MATCHALL "\n" lines "${out}")
  list(LENGTH lines out_lines)
  if(NOT rc EQUAL 0 OR NOT err STREQUAL "" OR NOT quiet_lines EQUAL out_lines)
    message(FATAL_ERROR "fp4attn ${ARGN} --quiet: exit code ${rc}, stderr '${err}', "
                        "${quiet_lines} stdout lines (${out_lines} without --quiet)")
  endif()
endfunction()
expect_progress(4 "input gaussian, recipe fp8" run --backend cpu --heads 1 --seqlen-q 32
                --head-dim 64 --recipe fp8 --input all)
expect_progress(${n_recipes} "input outliers, recipe ${first_recipe}" run --backend cpu --heads 1
                --seqlen-q 16 --head-dim 64 --input outliers)
expect_progress(8 "input gaussian, format nvfp4" decode --backend cpu --batch 1 --heads 2
                --kv-heads 1 --context 24 --head-dim 64 --input all --format all)
expect_progress(5 "input large-logits, recipe nvfp4" emulation --seqlen 16 --heads 1 --head-dim 64
                --input large-logits)
expect_progress(4 "input gaussian, recipe fp8" grad --recipe fp8 --input all --seqlen 16 --heads 1
                --head-dim 64)

# tools/build_info.cmake on scratch repositories (git here only writes inside them): outside git,
# unknown (a folder inside another repository included: this build folder may be in one);
# .deps/REVISION without git; HEAD's 12 hex digits when clean; untracked files do not count, an
# edit of a tracked file adds -dirty; $FP4ATTN_REVISION wins; an unchanged tree leaves the file
# alone, so nothing rebuilds.
if(GIT)
  set(given_revision "$ENV{FP4ATTN_REVISION}")  # the caller's, restored at the end
  unset(ENV{FP4ATTN_REVISION})
  set(repo "${CMAKE_CURRENT_BINARY_DIR}/cli revision repo")
  set(gen "${CMAKE_CURRENT_BINARY_DIR}/cli revision.cc")
  file(REMOVE_RECURSE "${repo}" "${gen}")
  file(MAKE_DIRECTORY "${repo}/python/fp4attn")
  file(WRITE "${repo}/python/fp4attn/_version.py" "__version__ = \"9.8.7rc1\"\n")
  function(git_in_repo)
    execute_process(COMMAND ${GIT} -C ${repo} -c user.name=fp4attn-cli-test
                            -c user.email=cli-test@invalid -c commit.gpgsign=false ${ARGN}
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "git ${ARGN} in ${repo}: ${err}")
    endif()
  endfunction()
  function(expect_revision what expected)
    execute_process(COMMAND ${CMAKE_COMMAND} -DSOURCE_DIR=${repo} -DOUTPUT=${gen}
                            -P ${source_dir}/tools/build_info.cmake RESULT_VARIABLE rc)
    file(READ "${gen}" text)
    if(NOT rc EQUAL 0 OR NOT text MATCHES "build_version\\(\\) { return \"9.8.7rc1\"; }"
       OR NOT text MATCHES "build_revision\\(\\) { return \"([^\"]*)\"; }")
      message(FATAL_ERROR "build_info.cmake, ${what}: exit code ${rc}, wrote:\n${text}")
    endif()
    set(got "${CMAKE_MATCH_1}")
    if(NOT got MATCHES "^${expected}$")
      message(FATAL_ERROR "build_info.cmake, ${what}: revision ${got}, expected ${expected}")
    endif()
  endfunction()
  expect_revision("no git" unknown)
  file(WRITE "${repo}/.deps/REVISION" "0123456789ab-dirty\n")
  expect_revision(".deps/REVISION" "0123456789ab-dirty")
  file(REMOVE_RECURSE "${repo}/.deps")
  git_in_repo(init -q)
  expect_revision("no commit" unknown)
  git_in_repo(add python/fp4attn/_version.py)
  git_in_repo(commit -q -m one)
  execute_process(COMMAND ${GIT} -C ${repo} rev-parse --short=12 HEAD OUTPUT_VARIABLE head
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  expect_revision("clean" "${head}")
  string(LENGTH "${head}" len)
  if(NOT head MATCHES "^[0-9a-f]+$" OR NOT len EQUAL 12)
    message(FATAL_ERROR "git rev-parse --short=12: '${head}'")
  endif()
  file(WRITE "${repo}/notes.txt" "untracked\n")
  expect_revision("untracked file" "${head}")
  set(ENV{FP4ATTN_REVISION} "given-rev.1")
  expect_revision("FP4ATTN_REVISION" "given-rev\\.1")
  unset(ENV{FP4ATTN_REVISION})
  find_program(TOUCH touch)
  if(TOUCH)
    expect_revision("clean again" "${head}")
    execute_process(COMMAND ${TOUCH} -d "2001-02-03 04:05:06" "${gen}")
    expect_revision("unchanged" "${head}")
    file(TIMESTAMP "${gen}" stamp "%Y" UTC)
    expect_equal("build_info.cmake: the year of an unchanged file" "${stamp}" 2001)
  endif()
  file(APPEND "${repo}/python/fp4attn/_version.py" "# edited\n")
  expect_revision("tracked edit" "${head}-dirty")
  if(TOUCH)
    file(TIMESTAMP "${gen}" stamp "%Y" UTC)
    if(stamp STREQUAL 2001)
      message(FATAL_ERROR "build_info.cmake: a new revision left the file as it was")
    endif()
  endif()
  git_in_repo(add -A)
  expect_revision("staged edit" "${head}-dirty")
  git_in_repo(commit -q -m two)
  execute_process(COMMAND ${GIT} -C ${repo} rev-parse --short=12 HEAD OUTPUT_VARIABLE head2
                  OUTPUT_STRIP_TRAILING_WHITESPACE)
  expect_revision("a new commit" "${head2}")
  if(head2 STREQUAL head)
    message(FATAL_ERROR "git commit in ${repo} kept HEAD at ${head}")
  endif()
  file(MAKE_DIRECTORY "${repo}/sub/python/fp4attn")
  file(WRITE "${repo}/sub/python/fp4attn/_version.py" "__version__ = \"9.8.7rc1\"\n")
  set(repo "${repo}/sub")
  expect_revision("a folder inside a repository" unknown)
  set(ENV{FP4ATTN_REVISION} "${given_revision}")
endif()
