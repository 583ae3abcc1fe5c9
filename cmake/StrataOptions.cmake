# Warnings, sanitizers and assertions applied to strata's own targets only (never to dependencies).

set(STRATA_WARNING_FLAGS -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Wold-style-cast
    -Wcast-align -Woverloaded-virtual -Wnull-dereference -Wimplicit-fallthrough)

if(STRATA_SANITIZE)
  string(REPLACE ";" "," _strata_san "${STRATA_SANITIZE}")
  add_compile_options(-fsanitize=${_strata_san} -fno-omit-frame-pointer -fno-sanitize-recover=all)
  add_link_options(-fsanitize=${_strata_san})
endif()

if(STRATA_FUZZ)
  # Coverage feedback for libFuzzer in every strata library; the targets add -fsanitize=fuzzer.
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()

# strata_target_defaults(TARGET): the project's warning set, -Werror when asked, assertions on.
function(strata_target_defaults target)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${STRATA_WARNING_FLAGS}>)
  if(STRATA_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
  endif()
  if(STRATA_ASSERTS)
    target_compile_definitions(${target} PRIVATE STRATA_ENABLE_ASSERTS=1)
  endif()
endfunction()
