# Writes the commit a build is made from into OUT as BMOE_COMMIT ("-dirty" when the tree has
# changes). Run at every build (a target in src/CMakeLists.txt); the file is rewritten only
# when its text changes, so an unchanged commit rebuilds nothing.
# Usage: cmake -DSOURCE_DIR=... -DOUT=... -P commit_info.cmake
execute_process(COMMAND git -C "${SOURCE_DIR}" rev-parse --short=12 HEAD OUTPUT_VARIABLE commit
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR commit STREQUAL "")
  set(commit "unknown")  # a source tree without git (a tarball)
else()
  execute_process(COMMAND git -C "${SOURCE_DIR}" diff --quiet HEAD -- RESULT_VARIABLE dirty ERROR_QUIET)
  if(dirty EQUAL 1)
    string(APPEND commit "-dirty")
  endif()
endif()
set(text "#define BMOE_COMMIT \"${commit}\"\n")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
