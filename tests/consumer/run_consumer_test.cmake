# ctest script: install cpprun into a scratch prefix, build tests/consumer against it with
# find_package(cpprun), and run it on 2 ranks with the installed launcher: one node, then two.
file(REMOVE_RECURSE ${CPPRUN_WORK_DIR})
set(prefix ${CPPRUN_WORK_DIR}/prefix)

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${CPPRUN_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${CPPRUN_CONSUMER_SOURCE} -B ${CPPRUN_WORK_DIR}/build
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${CPPRUN_WORK_DIR}/build)
run(${CPPRUN_ISOLATE} ${prefix}/bin/cpprun --standalone --nproc_per_node=2 ${CPPRUN_WORK_DIR}/build/consumer)
foreach(rank 0 1)
  if(NOT last_output MATCHES "consumer rank ${rank}/2 sum 3 ok")
    message(FATAL_ERROR "rank ${rank} did not report the right sum")
  endif()
endforeach()

# The installed launcher needs no LibTorch on one node or many: nothing of Torch's among what it
# loads, so it starts in milliseconds wherever it is installed. The workers' store is served by the
# installed cpprun-store-keeper beside it (both jobs above and below use it), which links LibTorch.
execute_process(COMMAND readelf -d ${prefix}/bin/cpprun OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR dynamic MATCHES "libtorch|libc10")
  message(FATAL_ERROR "the installed cpprun needs LibTorch (readelf rc ${rc}):\n${dynamic}")
endif()
# Its run path is the lib/ of the LibTorch it was built with, and nothing else (not Torch's stray
# MKL directories), so that it loads wherever it is installed.
set(keeper ${prefix}/bin/cpprun-store-keeper)
execute_process(COMMAND readelf -d ${keeper} OUTPUT_VARIABLE dynamic RESULT_VARIABLE rc)
string(REGEX MATCH "Library r(un)?path: \\[([^]]*)\\]" found "${dynamic}")
if(NOT rc EQUAL 0 OR NOT CMAKE_MATCH_2 STREQUAL "${CPPRUN_TORCH_LIB_DIR}")
  message(FATAL_ERROR "${keeper}'s run path is '${CMAKE_MATCH_2}', not ${CPPRUN_TORCH_LIB_DIR}:\n${dynamic}")
endif()
# A 2-node job with the installed cpprun, started from another directory (as a user's PATH would).
run(${CPPRUN_ISOLATE} bash ${CMAKE_CURRENT_LIST_DIR}/two_nodes.sh ${prefix}/bin/cpprun ${CPPRUN_WORK_DIR}/build/consumer)
foreach(rank 0 1)
  if(NOT last_output MATCHES "consumer rank ${rank}/2 sum 3 ok")
    message(FATAL_ERROR "two nodes: rank ${rank} did not report the right sum")
  endif()
endforeach()
file(REMOVE_RECURSE ${CPPRUN_WORK_DIR})
