# Assembles the web chat page: tools/web/index.html with the Markdown renderer and the HTML
# sanitiser it uses (marked and DOMPurify, from node_modules, as npm installed them) put inline
# where the page's <!--vendor:NAME--> markers stand, so the served page needs nothing from
# elsewhere. A library that is not installed leaves its marker (the page then shows answers as
# plain text). Run as a script:
#   cmake -DINPUT=index.html -DOUTPUT=page.html -DMODULES=node_modules -P web_page.cmake
file(READ "${INPUT}" page)
foreach(entry "marked=marked/lib/marked.umd.js" "dompurify=dompurify/dist/purify.min.js")
  string(REPLACE "=" ";" parts "${entry}")
  list(GET parts 0 name)
  list(GET parts 1 file)
  if(EXISTS "${MODULES}/${file}")
    file(READ "${MODULES}/${file}" code)
    # A "</script" in the code would end the inline script early; "<\/" means the same in JS.
    string(REPLACE "</script" "<\\/script" code "${code}")
    string(REPLACE "<!--vendor:${name}-->" "<script>\n${code}\n</script>" page "${page}")
  endif()
endforeach()
file(WRITE "${OUTPUT}.tmp" "${page}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
