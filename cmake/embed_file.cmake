# Turns a file into a C++ header holding its bytes, so a tool can serve it without reading
# anything at run time (bmoe-server's web page). Run as a script:
#   cmake -DINPUT=page.html -DOUTPUT=page.h -DNAME=kPage -P embed_file.cmake
# A byte array rather than a raw string literal: any content is safe, no delimiter to collide
# with, and no xxd needed on the build machine.
file(READ "${INPUT}" hex HEX)
string(LENGTH "${hex}" hex_length)
math(EXPR size "${hex_length} / 2")
# Twenty bytes a line keeps the header readable when a compile error points into it.
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "'\\\\x\\1'," bytes "${hex}")
string(REGEX REPLACE "(('[^']*',){20})" "\\1\n" bytes "${bytes}")
file(WRITE "${OUTPUT}.tmp"
     "// Generated from ${INPUT} by cmake/embed_file.cmake: do not edit.\n"
     "#pragma once\n#include <cstddef>\n#include <string_view>\n\n"
     "inline constexpr char ${NAME}_bytes[] = {\n${bytes}\n'\\0'};\n"
     "inline constexpr std::string_view ${NAME}{${NAME}_bytes, ${size}};\n")
# Only a changed page rewrites the header, so an unchanged one recompiles nothing.
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
