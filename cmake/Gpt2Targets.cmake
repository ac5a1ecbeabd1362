# One library per folder, tests beside them through one helper each (STYLE.md).

set(GPT2_WARNING_FLAGS -Wall -Wextra -Wno-unused-parameter)
if(GPT2_WARNINGS_AS_ERRORS)
  list(APPEND GPT2_WARNING_FLAGS -Werror)
endif()

# gpt2_library(NAME ALIAS SOURCES ... [PUBLIC_LIBS ...] [PRIVATE_LIBS ...])
function(gpt2_library name)
  cmake_parse_arguments(ARG "" "ALIAS" "SOURCES;PUBLIC_LIBS;PRIVATE_LIBS" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  if(ARG_ALIAS)
    add_library(${ARG_ALIAS} ALIAS ${name})
  endif()
  target_include_directories(${name} PUBLIC ${PROJECT_SOURCE_DIR})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GPT2_WARNING_FLAGS}>)
  target_link_libraries(${name} PUBLIC ${ARG_PUBLIC_LIBS} PRIVATE ${ARG_PRIVATE_LIBS})
  set_target_properties(${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
endfunction()

function(gpt2_executable name)
  cmake_parse_arguments(ARG "" "" "SOURCES;LIBS" ${ARGN})
  add_executable(${name} ${ARG_SOURCES})
  target_compile_options(${name} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:${GPT2_WARNING_FLAGS}>)
  target_link_libraries(${name} PRIVATE ${ARG_LIBS})
endfunction()

# The CPU arithmetic of a step must give the same bits whatever instruction set ATen and our CPU
# kernels pick (Note [Partition-free arithmetic], optim/grad_norm.h). A test added with ISA_VARIANTS
# also runs as NAME_isa_default (baseline x86-64: ATEN_CPU_CAPABILITY=default, GPT2_CPU_ADAMW_ISA
# and GPT2_CPU_INT8_ISA=baseline) and, on a CPU with AVX-512, as NAME_isa_avx2 (ATen and our kernels
# capped at AVX2); the plain run uses the CPU's best. Labelled `isa` as well.
set(GPT2_ISA_VARIANTS "default|ATEN_CPU_CAPABILITY=default|GPT2_CPU_ADAMW_ISA=baseline|GPT2_CPU_INT8_ISA=baseline")  # name|environment
if(EXISTS /proc/cpuinfo)
  file(STRINGS /proc/cpuinfo _gpt2_avx512 REGEX "^flags.* avx512f" LIMIT_COUNT 1)
  if(_gpt2_avx512)
    list(APPEND GPT2_ISA_VARIANTS "avx2|ATEN_CPU_CAPABILITY=avx2|GPT2_CPU_ADAMW_ISA=avx2")
  endif()
endif()

# gpt2_add_isa_variants(NAME LABELS TIMEOUT COMMAND ...): the runs above of one test command.
function(gpt2_add_isa_variants name labels timeout)
  foreach(variant IN LISTS GPT2_ISA_VARIANTS)
    string(REPLACE "|" ";" parts "${variant}")
    list(GET parts 0 isa)
    list(SUBLIST parts 1 -1 env)
    add_test(NAME ${name}_isa_${isa} COMMAND ${ARGN} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
    set_tests_properties(${name}_isa_${isa} PROPERTIES LABELS "${labels};isa" TIMEOUT ${timeout}
                         ENVIRONMENT "GPT2_SOURCE_DIR=${PROJECT_SOURCE_DIR};${env}")
  endforeach()
endfunction()

# Serial GoogleTest binary; each TEST becomes a CTest case labelled `unit` and the LABELS given
# (e.g. `gpu`: checks that skip without a GPU and run on the GPU machine, `ctest -L gpu`).
# gpt2_add_test(NAME SOURCES ... LIBS ... [LABELS ...] [ISA_VARIANTS])
function(gpt2_add_test name)
  cmake_parse_arguments(ARG "ISA_VARIANTS" "" "SOURCES;LIBS;LABELS" ${ARGN})
  gpt2_executable(${name} SOURCES ${ARG_SOURCES} LIBS ${ARG_LIBS} GTest::gtest_main)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  # One label here: gtest_discover_tests cannot pass a list-valued property through.
  gtest_discover_tests(${name} WORKING_DIRECTORY ${PROJECT_SOURCE_DIR}
                       PROPERTIES LABELS unit ENVIRONMENT "GPT2_SOURCE_DIR=${PROJECT_SOURCE_DIR}"
                       DISCOVERY_TIMEOUT 60)
  if(ARG_LABELS)
    # The full list is set by a CTest include file that runs after the discovered tests' file
    # (include files run in the order added), over the names discovery listed in ${name}_TESTS.
    set(labels unit ${ARG_LABELS})
    set(script "${CMAKE_CURRENT_BINARY_DIR}/${name}_labels.cmake")
    file(WRITE "${script}"
         "if(${name}_TESTS)\n  set_tests_properties(\${${name}_TESTS} PROPERTIES LABELS \"${labels}\")\nendif()\n")
    set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
  endif()
  if(ARG_ISA_VARIANTS)  # the whole binary once per variant
    gpt2_add_isa_variants(${name} unit 600 $<TARGET_FILE:${name}>)
  endif()
endfunction()

# MPI test: one binary run as NP ranks through mpiexec (HDF5's testpar pattern). The binary links
# tests/mpi_gtest_main.cpp, which initialises MPI, silences ranks > 0 and reduces failures.
# gpt2_add_mpi_test(NAME NP SOURCES ... LIBS ... [LABELS ...] [TIMEOUT s])
function(gpt2_add_mpi_test name np)
  cmake_parse_arguments(ARG "ISA_VARIANTS" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  if(NOT TARGET ${name})
    gpt2_executable(${name} SOURCES ${ARG_SOURCES} ${PROJECT_SOURCE_DIR}/tests/mpi_gtest_main.cpp
                    LIBS ${ARG_LIBS} GTest::gtest MPI::MPI_C)
    set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name}_np${np}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${np} ${GPT2_MPIEXEC_PREFLAGS}
                   $<TARGET_FILE:${name}>
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name}_np${np} PROPERTIES PROCESSORS ${np} LABELS "mpi;${ARG_LABELS}"
                       TIMEOUT ${ARG_TIMEOUT} ENVIRONMENT "GPT2_SOURCE_DIR=${PROJECT_SOURCE_DIR}")
  if(ARG_ISA_VARIANTS)
    gpt2_add_isa_variants(${name}_np${np} "mpi;${ARG_LABELS}" ${ARG_TIMEOUT} ${MPIEXEC_EXECUTABLE}
                          ${MPIEXEC_NUMPROC_FLAG} ${np} ${GPT2_MPIEXEC_PREFLAGS} $<TARGET_FILE:${name}>)
    foreach(variant IN LISTS GPT2_ISA_VARIANTS)
      string(REPLACE "|" ";" parts "${variant}")
      list(GET parts 0 isa)
      set_tests_properties(${name}_np${np}_isa_${isa} PROPERTIES PROCESSORS ${np})
    endforeach()
  endif()
endfunction()

# Test driven by a Python reference (transformers, tiktoken, h5py) from .venv.
# gpt2_add_py_test(NAME SCRIPT [ARGS ...] [LABELS ...] [TIMEOUT s])
function(gpt2_add_py_test name)
  cmake_parse_arguments(ARG "" "SCRIPT;TIMEOUT" "ARGS;LABELS" ${ARGN})
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 600)
  endif()
  add_test(NAME ${name} COMMAND ${GPT2_PYTHON} ${ARG_SCRIPT} ${ARG_ARGS}
           WORKING_DIRECTORY ${PROJECT_SOURCE_DIR})
  set_tests_properties(${name} PROPERTIES LABELS "python;${ARG_LABELS}" TIMEOUT ${ARG_TIMEOUT}
                       ENVIRONMENT "GPT2_SOURCE_DIR=${PROJECT_SOURCE_DIR};GPT2_BIN_DIR=${CMAKE_BINARY_DIR}/bin;GPT2_TEST_BIN_DIR=${CMAKE_BINARY_DIR}/tests;PYTHONDONTWRITEBYTECODE=1")
endfunction()

# Allow mpiexec as root (CI and the GPU machine run as root) and oversubscription on 2 cores.
set(GPT2_MPIEXEC_PREFLAGS --oversubscribe ${MPIEXEC_PREFLAGS})
if(DEFINED ENV{USER} AND "$ENV{USER}" STREQUAL "root" OR NOT DEFINED ENV{USER})
  list(APPEND GPT2_MPIEXEC_PREFLAGS --allow-run-as-root)
endif()
include(GoogleTest OPTIONAL)
