# Writes OUT, a header defining MOK_GIT_COMMIT: the checkout's commit at build time, "+changes"
# when tracked files differ from it, "unknown" outside git. Rewritten only when its text changes,
# so a build recompiles what includes it only after a commit. Usage (every build, CMakeLists.txt):
#   cmake -DSOURCE=DIR -DOUT=FILE -P commit_header.cmake
execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY ${SOURCE}
                OUTPUT_VARIABLE commit OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET
                RESULT_VARIABLE failed)
# A source tree unpacked inside another checkout is not that checkout's commit.
execute_process(COMMAND git rev-parse --show-toplevel WORKING_DIRECTORY ${SOURCE}
                OUTPUT_VARIABLE top OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
file(REAL_PATH "${SOURCE}" source_real)
if(top)
  file(REAL_PATH "${top}" top)
endif()
if(failed OR NOT commit OR NOT top STREQUAL source_real)
  set(commit unknown)
else()
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY ${SOURCE}
                  RESULT_VARIABLE differs ERROR_QUIET)
  if(differs EQUAL 1)
    string(APPEND commit "+changes")
  endif()
endif()
set(text "#pragma once\n#define MOK_GIT_COMMIT \"${commit}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
