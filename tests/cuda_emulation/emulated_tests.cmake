# test_flash_attention_emulated: the CUDA flash-attention kernels run on the CPU by the
# SIMT emulator (see README.md). Included from the top-level CMakeLists.txt inside
# if(TANDEM_BUILD_TESTS); it is plain C++, so it is built and run with or without nvcc.
#
# The emulated translation unit is generated at build time from the current
# flash_attention.cu, so the test always exercises the kernels as they are.

set(TANDEM_EMULATION_DIR ${PROJECT_SOURCE_DIR}/tests/cuda_emulation)
# A cache variable so that the test can be pointed at a modified copy of the kernels (to
# see that it catches a deliberate bug, say) without touching the tree.
set(TANDEM_EMULATED_FLASH_SOURCE ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/flash_attention.cu
    CACHE FILEPATH "The flash-attention CUDA source that test_flash_attention_emulated runs")
set(TANDEM_FLASH_EMULATED_TU ${PROJECT_BINARY_DIR}/cuda_emulation/flash_attention_emulated.cc)

add_custom_command(
  OUTPUT ${TANDEM_FLASH_EMULATED_TU}
  COMMAND ${CMAKE_COMMAND} -DKERNEL_SOURCE=${TANDEM_EMULATED_FLASH_SOURCE}
          -DPRIMITIVES=${TANDEM_EMULATION_DIR}/hardware_primitives.inc
          -DOUTPUT=${TANDEM_FLASH_EMULATED_TU}
          -P ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  DEPENDS ${TANDEM_EMULATED_FLASH_SOURCE}
          ${TANDEM_EMULATION_DIR}/hardware_primitives.inc
          ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  COMMENT "Generating the emulated flash_attention.cu"
  VERBATIM)

add_executable(test_flash_attention_emulated
  ${PROJECT_SOURCE_DIR}/tests/cuda_emulation/test_flash_attention_emulated.cc
  ${TANDEM_FLASH_EMULATED_TU}
  ${TANDEM_EMULATION_DIR}/simt_emulator.cc)
target_compile_options(test_flash_attention_emulated PRIVATE -Wall -Wextra)
# The kernels' CUDA-only "#pragma unroll" means nothing to GCC.
set_source_files_properties(${TANDEM_FLASH_EMULATED_TU} PROPERTIES
  COMPILE_OPTIONS -Wno-unknown-pragmas)
# stub/ first: its cuda_runtime.h and cuda_bf16.h must win over the toolkit's. Nothing of
# tandem_lib is linked (the kernels' headers are self-contained), so the real kernels and
# the CUDA runtime stay out of this executable.
target_include_directories(test_flash_attention_emulated PRIVATE
  ${TANDEM_EMULATION_DIR}/stub ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
target_link_libraries(test_flash_attention_emulated PRIVATE GTest::gtest GTest::gtest_main)
gtest_discover_tests(test_flash_attention_emulated
  TEST_PREFIX flash_attention_emulated.
  DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 300 LABELS cuda_emulation)

# test_kernels_emulated: the kernels of kernels.cu (embedding, LayerNorm, elementwise,
# cross-entropy, reductions) on the emulator, against the CPU backend's kernels. kernels.cu
# has no hardware-primitives section: the generator (MODE=launches) keeps all of it and
# rewrites its <<<...>>> launches and static __shared__ arrays; stub/ supplies the rest
# (uint2/uint4, cudaGetLastError, cub::DeviceRadixSort).
set(TANDEM_EMULATED_KERNELS_SOURCE ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/kernels.cu
    CACHE FILEPATH "The CUDA kernels source that test_kernels_emulated runs")
set(TANDEM_KERNELS_EMULATED_TU ${PROJECT_BINARY_DIR}/cuda_emulation/kernels_emulated.cc)

add_custom_command(
  OUTPUT ${TANDEM_KERNELS_EMULATED_TU}
  COMMAND ${CMAKE_COMMAND} -DKERNEL_SOURCE=${TANDEM_EMULATED_KERNELS_SOURCE} -DMODE=launches
          -DOUTPUT=${TANDEM_KERNELS_EMULATED_TU}
          -P ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  DEPENDS ${TANDEM_EMULATED_KERNELS_SOURCE}
          ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  COMMENT "Generating the emulated kernels.cu"
  VERBATIM)

# The emulated kernels.cu and the emulator, compiled once for every test that runs them
# (test_kernels_emulated, and test_cublaslt_emulated for broadcast_rows).
add_library(tandem_kernels_emulated OBJECT
  ${TANDEM_KERNELS_EMULATED_TU}
  ${TANDEM_EMULATION_DIR}/simt_emulator.cc)
target_compile_options(tandem_kernels_emulated PRIVATE -Wall -Wextra)
# The kernels load and store through uint2/uint4 (as nvcc allows); on the host that is
# type punning, which strict aliasing would let GCC miscompile.
set_source_files_properties(${TANDEM_KERNELS_EMULATED_TU} PROPERTIES
  COMPILE_OPTIONS "-Wno-unknown-pragmas;-fno-strict-aliasing")
target_include_directories(tandem_kernels_emulated BEFORE PRIVATE
  ${TANDEM_EMULATION_DIR}/stub ${PROJECT_SOURCE_DIR}/src)
# For tandem_lib's compile definitions, as the tests that use these objects see them.
target_link_libraries(tandem_kernels_emulated PRIVATE tandem_lib)

add_executable(test_kernels_emulated
  ${PROJECT_SOURCE_DIR}/tests/cuda_emulation/test_kernels_emulated.cc
  $<TARGET_OBJECTS:tandem_kernels_emulated>)
target_compile_options(test_kernels_emulated PRIVATE -Wall -Wextra)
# test_util.h names the repository (for the bundled data).
target_compile_definitions(test_kernels_emulated PRIVATE TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
target_include_directories(test_kernels_emulated BEFORE PRIVATE
  ${TANDEM_EMULATION_DIR}/stub ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
# tandem_lib for the CPU reference kernels. The emulated translation unit defines every
# tandem::cuda symbol that kernels.cu does, so the linker never takes the real kernels'
# object (present in a CUDA build) from the archive.
target_link_libraries(test_kernels_emulated PRIVATE tandem_lib GTest::gtest GTest::gtest_main)
gtest_discover_tests(test_kernels_emulated
  TEST_PREFIX kernels_emulated.
  DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 300 LABELS cuda_emulation)

# test_cublaslt_emulated: cublaslt_matmul.cu (the matmuls through cuBLASLt) against the CPU
# backend's matmuls, with stub/cublasLt.h computing what NVIDIA documents cublasLtMatmul to
# compute, on the host. The source has no launches of its own; the generator (MODE=launches)
# copies it into a .cc so that the host compiler builds it, and broadcast_rows (its bias
# fallback) comes from the emulated kernels.cu above.
set(TANDEM_EMULATED_CUBLASLT_SOURCE
    ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/cublaslt_matmul.cu
    CACHE FILEPATH "The cuBLASLt matmul CUDA source that test_cublaslt_emulated runs")
set(TANDEM_CUBLASLT_EMULATED_TU ${PROJECT_BINARY_DIR}/cuda_emulation/cublaslt_matmul_emulated.cc)

add_custom_command(
  OUTPUT ${TANDEM_CUBLASLT_EMULATED_TU}
  COMMAND ${CMAKE_COMMAND} -DKERNEL_SOURCE=${TANDEM_EMULATED_CUBLASLT_SOURCE} -DMODE=launches
          -DOUTPUT=${TANDEM_CUBLASLT_EMULATED_TU}
          -P ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  DEPENDS ${TANDEM_EMULATED_CUBLASLT_SOURCE}
          ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
  COMMENT "Generating the emulated cublaslt_matmul.cu"
  VERBATIM)

add_executable(test_cublaslt_emulated
  ${PROJECT_SOURCE_DIR}/tests/cuda_emulation/test_cublaslt_emulated.cc
  ${TANDEM_CUBLASLT_EMULATED_TU}
  $<TARGET_OBJECTS:tandem_kernels_emulated>)
target_compile_options(test_cublaslt_emulated PRIVATE -Wall -Wextra)
# test_util.h names the repository (for the bundled data).
target_compile_definitions(test_cublaslt_emulated PRIVATE TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
# stub/ first: its cublasLt.h and cuda_runtime.h must win over the toolkit's.
target_include_directories(test_cublaslt_emulated BEFORE PRIVATE
  ${TANDEM_EMULATION_DIR}/stub ${PROJECT_SOURCE_DIR}/src ${PROJECT_SOURCE_DIR}/tests)
# tandem_lib for the CPU reference matmuls. The emulated translation units define every
# tandem::cuda symbol of cublaslt_matmul.cu and kernels.cu, so the linker never takes the
# real objects (present in a CUDA build) from the archive, and the stub's functions, C++
# rather than extern "C", never meet the real cuBLASLt's.
target_link_libraries(test_cublaslt_emulated PRIVATE tandem_lib GTest::gtest GTest::gtest_main)
gtest_discover_tests(test_cublaslt_emulated
  TEST_PREFIX cublaslt_emulated.
  DISCOVERY_TIMEOUT 60
  PROPERTIES TIMEOUT 300 LABELS cuda_emulation)

# The emulated GPU: tandem_lib_emulated_gpu is tandem_lib built from the same sources with
# TANDEM_HAVE_CUDA defined (so the *_unavailable.cc stand-ins compile to nothing) and every
# CUDA source in its emulated form, against stub/ instead of the toolkit: the runtime
# (devices, memory, streams, events) from stub/cuda_runtime.h, cuBLASLt from
# stub/cublasLt.h, the kernels on the emulator. The GPU tests are compiled a second time
# against it (test_*_emulated below), so they run, rather than skip, without a GPU or nvcc.
# Built only for these tests: the tandem binary and the other tests keep tandem_lib.
set(TANDEM_EMULATED_GPU_TUS
  ${TANDEM_FLASH_EMULATED_TU} ${TANDEM_KERNELS_EMULATED_TU} ${TANDEM_CUBLASLT_EMULATED_TU})
# The rest of src/tandem's .cu files, each in its emulated form (MODE=launches): the
# device, the backend, every optimizer's kernels (optim/<name>/*.cu: a new optimizer's are
# emulated without an edit here) and the bench's.
file(GLOB_RECURSE TANDEM_OTHER_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tandem/*.cu)
list(REMOVE_ITEM TANDEM_OTHER_CUDA_SOURCES
     ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/flash_attention.cu
     ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/kernels.cu
     ${PROJECT_SOURCE_DIR}/src/tandem/compute/cuda/cublaslt_matmul.cu)
foreach(cuda_path ${TANDEM_OTHER_CUDA_SOURCES})
  get_filename_component(cuda_name ${cuda_path} NAME_WE)
  set(emulated_tu ${PROJECT_BINARY_DIR}/cuda_emulation/${cuda_name}_emulated.cc)
  add_custom_command(
    OUTPUT ${emulated_tu}
    COMMAND ${CMAKE_COMMAND} -DKERNEL_SOURCE=${cuda_path}
            -DMODE=launches -DOUTPUT=${emulated_tu}
            -P ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
    DEPENDS ${cuda_path}
            ${TANDEM_EMULATION_DIR}/generate_emulated_source.cmake
    COMMENT "Generating the emulated ${cuda_name}.cu"
    VERBATIM)
  set_source_files_properties(${emulated_tu} PROPERTIES
    COMPILE_OPTIONS "-Wno-unknown-pragmas;-fno-strict-aliasing")
  list(APPEND TANDEM_EMULATED_GPU_TUS ${emulated_tu})
endforeach()
# Every .cu is emulated (a check that the globs above stay in step).
file(GLOB_RECURSE TANDEM_ALL_CUDA_SOURCES CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/src/tandem/*.cu)
list(LENGTH TANDEM_ALL_CUDA_SOURCES cuda_source_count)
list(LENGTH TANDEM_EMULATED_GPU_TUS emulated_source_count)
if(NOT cuda_source_count EQUAL emulated_source_count)
  message(FATAL_ERROR "tests/cuda_emulation/emulated_tests.cmake: src/tandem has "
                      "${cuda_source_count} .cu files but ${emulated_source_count} are emulated")
endif()

add_library(tandem_lib_emulated_gpu STATIC EXCLUDE_FROM_ALL
  ${TANDEM_SOURCES} ${TANDEM_EMULATED_GPU_TUS} ${TANDEM_EMULATION_DIR}/simt_emulator.cc)
target_include_directories(tandem_lib_emulated_gpu BEFORE PUBLIC
  ${TANDEM_EMULATION_DIR}/stub ${PROJECT_SOURCE_DIR}/src)
target_include_directories(tandem_lib_emulated_gpu SYSTEM PRIVATE
  ${OPENBLAS_INCLUDE_DIR} ${XXHASH_INCLUDE_DIR})
target_compile_options(tandem_lib_emulated_gpu PRIVATE -Wall -Wextra)
target_compile_definitions(tandem_lib_emulated_gpu PUBLIC
  TANDEM_VERSION="${PROJECT_VERSION}" TANDEM_HAVE_CUDA=1)
target_link_libraries(tandem_lib_emulated_gpu
  PUBLIC OpenMP::OpenMP_CXX nlohmann_json::nlohmann_json
  PRIVATE ${OPENBLAS_LIBRARY} ${XXHASH_LIBRARY})

# The GPU tests, unchanged, on the emulated GPU. Filters leave out what cannot pass for a
# reason of the emulation's own (see README.md).
function(tandem_emulated_gpu_test name source filter)
  add_executable(${name} ${source})
  target_compile_options(${name} PRIVATE -Wall -Wextra)
  target_include_directories(${name} PRIVATE ${PROJECT_SOURCE_DIR}/tests)
  target_compile_definitions(${name} PRIVATE TANDEM_EMULATED_GPU=1
    TANDEM_SOURCE_DIR="${PROJECT_SOURCE_DIR}" TANDEM_BINARY="$<TARGET_FILE:tandem>")
  target_link_libraries(${name} PRIVATE tandem_lib_emulated_gpu GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name}
    TEST_PREFIX ${name}.
    TEST_FILTER ${filter}
    DISCOVERY_TIMEOUT 60
    PROPERTIES TIMEOUT 300 LABELS cuda_emulation)
endfunction()
tandem_emulated_gpu_test(test_cuda_device_emulated ${PROJECT_SOURCE_DIR}/tests/device/test_cuda_device.cc "*")
# FiftyTrainingStepsMatchTheCpuRun is left out for time only (about 33 s of emulated
# kernels in a Release build; the whole file takes 115 s with it): the fp32 model is still
# checked against the CPU on one step (TinyModel...), and 50 steps run in bf16. Run it by
# hand with --gtest_filter='*FiftyTraining*'.
tandem_emulated_gpu_test(test_cuda_backend_emulated ${PROJECT_SOURCE_DIR}/tests/compute/test_cuda_backend.cc
  "-CudaBackend.FiftyTrainingStepsMatchTheCpuRun")
# Only its CUDA test: the others run on the CPU device, in test_update_engine already.
tandem_emulated_gpu_test(test_demo_cuda_emulated ${PROJECT_SOURCE_DIR}/tests/optim/demo/test_demo_cuda.cc "*")
tandem_emulated_gpu_test(test_demo_rule_emulated ${PROJECT_SOURCE_DIR}/tests/optim/demo/test_demo_rule.cc
                         "DemoRuleCuda.*")
# The optimizer recipe's SGD (optim/sgd/) on the GPU: its kernel against the scalar reference.
tandem_emulated_gpu_test(test_sgd_recipe_emulated ${PROJECT_SOURCE_DIR}/tests/optim/test_sgd_recipe.cc
                         "SgdRecipeCuda.*")
tandem_emulated_gpu_test(test_update_engine_emulated ${PROJECT_SOURCE_DIR}/tests/offload/test_update_engine.cc "*Cuda*")
# Data parallelism on the cuda device: two in-process ranks on the emulated GPU, every stage.
tandem_emulated_gpu_test(test_data_parallel_gpu_emulated
  ${PROJECT_SOURCE_DIR}/tests/zero/test_data_parallel_gpu.cc "*")
# The emulated GPU with its streams run out of order (emulated_streams.h): training gives
# the same bits whatever order the streams' work runs in, as long as CUDA's promises hold.
tandem_emulated_gpu_test(test_step_plan_gpu_emulated
  ${PROJECT_SOURCE_DIR}/tests/config/test_step_plan_gpu.cc "*")
tandem_emulated_gpu_test(test_stream_order_emulated
  ${PROJECT_SOURCE_DIR}/tests/cuda_emulation/test_stream_order_emulated.cc "*")
# The one-rank device communicator's contract over emulated device memory.
tandem_emulated_gpu_test(test_one_rank_device_communicator_emulated
  ${PROJECT_SOURCE_DIR}/tests/comm/test_one_rank_device_communicator.cc "*/cuda")
