# Runs COMMAND (a ;-list) and passes only if it exits non-zero, prints a match for every regex in
# EXPECT (a ;-list, in any order: ranks print concurrently), and ends within MAX_SECONDS: a job that
# must fail on every rank, not hang.
string(TIMESTAMP start "%s" UTC)
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE result OUTPUT_VARIABLE out ERROR_VARIABLE err
                TIMEOUT 30)
string(TIMESTAMP stop "%s" UTC)
math(EXPR elapsed "${stop} - ${start}")
message("${out}${err}")
message("exit status: ${result}, ${elapsed} s")
if(result EQUAL 0)
  message(FATAL_ERROR "expected a non-zero exit status")
endif()
if(result MATCHES "timeout")
  message(FATAL_ERROR "the job did not end on its own")
endif()
foreach(pattern IN LISTS EXPECT)
  if(NOT "${out}${err}" MATCHES "${pattern}")
    message(FATAL_ERROR "output does not match '${pattern}'")
  endif()
endforeach()
if(elapsed GREATER MAX_SECONDS)
  message(FATAL_ERROR "took ${elapsed} s, more than ${MAX_SECONDS} s")
endif()
