# ctest script: an example trained on N ranks must print the same loss curve as on one process
# (same global batch), and its replicas must end in sync.
# -DLAUNCHER -DPROGRAM -DNPROC -DISOLATE [-DARGS="..."] -DTOLERANCE=x (largest difference of a printed loss)
separate_arguments(args UNIX_COMMAND "${ARGS}")
include(${CMAKE_CURRENT_LIST_DIR}/run_under_cpprun.cmake)

function(run_with nproc out_var)
  run_under_cpprun(${nproc} "" 240 out)
  if(NOT out MATCHES "replicas in sync")
    message(FATAL_ERROR "${PROGRAM} on ${nproc} rank(s) did not report replicas in sync")
  endif()
  string(REGEX MATCHALL "step +[0-9]+/[0-9]+ +loss [0-9.]+" losses "${out}")
  if(losses STREQUAL "")
    message(FATAL_ERROR "no loss lines in the output")
  endif()
  set(${out_var} "${losses}" PARENT_SCOPE)
endfunction()

run_with(1 single)
run_with(${NPROC} parallel)
# Same curve up to rounding: summation order differs between 1 and N ranks (TOLERANCE: see the
# test's definition in tests/CMakeLists.txt).
string(REGEX REPLACE "[^;]*loss " "" single_values "${single}")
string(REGEX REPLACE "[^;]*loss " "" parallel_values "${parallel}")
string(REPLACE ";" " " single_values "${single_values}")
string(REPLACE ";" " " parallel_values "${parallel_values}")
execute_process(COMMAND awk -v a=${single_values} -v b=${parallel_values} -v tol=${TOLERANCE} "BEGIN {
    n = split(a, x, \" \"); m = split(b, y, \" \"); if (n != m || n == 0) exit 1;
    for (i = 1; i <= n; i++) { d = x[i] - y[i]; if (d < 0) d = -d; if (d > max) max = d }
    printf \"largest difference of a printed loss: %g (tolerance %g)\\n\", max, tol; exit !(max <= tol) }"
  RESULT_VARIABLE same)
if(NOT same EQUAL 0)
  message(FATAL_ERROR "loss curves differ by more than ${TOLERANCE}:\n  1 rank:  ${single}\n  ${NPROC} ranks: ${parallel}")
endif()
# And the loss must fall (if(LESS) compares as floating-point numbers).
list(GET single 0 first)
list(GET single -1 last)
string(REGEX REPLACE ".*loss " "" first "${first}")
string(REGEX REPLACE ".*loss " "" last "${last}")
if(NOT last LESS first)
  message(FATAL_ERROR "the loss did not fall: first ${first}, last ${last}")
endif()
