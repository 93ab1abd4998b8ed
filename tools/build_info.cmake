# Writes the version and git revision of the source tree into a C++ file (cmake -P, run on every
# build by the target fp4attn_build_info in tools/CMakeLists.txt):
#   cmake -DSOURCE_DIR=<project root> -DOUTPUT=<file.cc> -P build_info.cmake
# The file is rewritten only when its text changes, so an unchanged tree rebuilds nothing; a
# commit or an edit of a tracked file recompiles that one file and relinks.
#
# revision: $FP4ATTN_REVISION when set (a copy of the tree whose .git is stale, as
# bench/record.py and scripts/gpu-check take it), else git's HEAD as 12 hex digits plus "-dirty"
# when tracked files differ from HEAD (as `git describe --dirty` and scripts/gpu-check say it;
# untracked files do not count), else .deps/REVISION (scripts/gpu-check --prepare, for a copy
# without .git), else "unknown". Git counts only when SOURCE_DIR is the top of its work tree, not a
# folder inside some other repository.
# version: python/fp4attn/_version.py's __version__, else pyproject.toml's, else "unknown".
cmake_minimum_required(VERSION 3.25)
if(NOT SOURCE_DIR OR NOT OUTPUT)
  message(FATAL_ERROR "build_info.cmake: pass -DSOURCE_DIR=... -DOUTPUT=...")
endif()

function(git_revision out)
  set(${out} "" PARENT_SCOPE)
  find_program(GIT_EXECUTABLE git)
  if(NOT GIT_EXECUTABLE)
    return()
  endif()
  # --no-optional-locks: the index is read, never refreshed on disk (builds run beside editors).
  set(git ${GIT_EXECUTABLE} --no-optional-locks -C ${SOURCE_DIR})
  execute_process(COMMAND ${git} rev-parse --show-toplevel OUTPUT_VARIABLE top
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0)
    return()
  endif()
  file(REAL_PATH "${top}" top)
  file(REAL_PATH "${SOURCE_DIR}" src)
  if(NOT top STREQUAL src)
    return()
  endif()
  execute_process(COMMAND ${git} rev-parse --short=12 HEAD OUTPUT_VARIABLE rev
                  RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(NOT rc EQUAL 0 OR NOT rev MATCHES "^[0-9a-f]+$")
    return()  # no commit yet
  endif()
  execute_process(COMMAND ${git} status --porcelain --untracked-files=no OUTPUT_VARIABLE changes
                  RESULT_VARIABLE rc ERROR_QUIET)
  if(NOT rc EQUAL 0 OR NOT changes STREQUAL "")
    string(APPEND rev "-dirty")
  endif()
  set(${out} "${rev}" PARENT_SCOPE)
endfunction()

# A value fit for a C string literal and a JSON string: what a revision or version is made of.
function(checked_value out text)
  string(STRIP "${text}" text)
  if(NOT text MATCHES "^[A-Za-z0-9._+-]+$")
    set(text "unknown")
  endif()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(revision "$ENV{FP4ATTN_REVISION}")
if(revision STREQUAL "")
  git_revision(revision)
endif()
if(revision STREQUAL "" AND EXISTS "${SOURCE_DIR}/.deps/REVISION")
  file(READ "${SOURCE_DIR}/.deps/REVISION" revision)
endif()
checked_value(revision "${revision}")

set(version "")
if(EXISTS "${SOURCE_DIR}/python/fp4attn/_version.py")
  file(STRINGS "${SOURCE_DIR}/python/fp4attn/_version.py" line REGEX "^__version__ *= *\"")
  string(REGEX REPLACE "^__version__ *= *\"([^\"]*)\".*" "\\1" version "${line}")
endif()
if(version STREQUAL "" AND EXISTS "${SOURCE_DIR}/pyproject.toml")
  file(STRINGS "${SOURCE_DIR}/pyproject.toml" line REGEX "^version *= *\"" LIMIT_COUNT 1)
  string(REGEX REPLACE "^version *= *\"([^\"]*)\".*" "\\1" version "${line}")
endif()
checked_value(version "${version}")

set(text "// Written by tools/build_info.cmake on every build; do not edit.
#include \"build_info.h\"

namespace fp4attn::cli {

const char* build_version() { return \"${version}\"; }
const char* build_revision() { return \"${revision}\"; }

}  // namespace fp4attn::cli
")
set(old "")
if(EXISTS "${OUTPUT}")
  file(READ "${OUTPUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUTPUT}" "${text}")
endif()
