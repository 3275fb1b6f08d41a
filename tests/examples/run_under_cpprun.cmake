# Included by the example tests' scripts: runs PROGRAM with ${args} on `nproc` ranks under the
# launcher (LAUNCHER, ISOLATE), in `dir` (empty: the current one), prints what it wrote, fails
# unless it exits 0, and sets `out_var` to its standard output.
function(run_under_cpprun nproc dir timeout out_var)
  set(in_dir "")
  if(dir)
    set(in_dir WORKING_DIRECTORY ${dir})
  endif()
  execute_process(COMMAND ${ISOLATE} ${LAUNCHER} --standalone --nproc_per_node=${nproc} ${PROGRAM} ${args}
                  ${in_dir} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${timeout})
  message("--- ${nproc} rank(s):\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${PROGRAM} on ${nproc} rank(s) exited with ${rc}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
