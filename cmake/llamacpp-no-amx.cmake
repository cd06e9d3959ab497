# On x86, compile llama.cpp without its AMX kernels. Included after every project() of
# llama-cpp-python's build (CMAKE_PROJECT_INCLUDE, set in tox.ini); harness/runtimes/llamacpp_setup.py
# refuses a build that has AMX kernels, with the command to rebuild. With GGML_NATIVE (the default) ggml builds for
# -march=native, and on hosts with AMX-INT8 (Intel Sapphire Rapids and later) its AMX path repacks
# Q4_0 weights and then segfaults on the first decode (measured here on 2026-12-05, 1 or 2 threads;
# ggml-org/llama.cpp#20824, #26954). Explicit -mno-amx-* win over -march=native in GCC and Clang;
# every other native kernel (AVX2, AVX-512, VNNI and the Q4_0 repack) stays.
# Compilers older than GCC 11 / Clang 11 know no AMX, hence no -mno-amx-*: they are left as they are.
include(CheckCCompilerFlag)
if(CMAKE_SYSTEM_PROCESSOR MATCHES "^(x86_64|AMD64|amd64|i[3-6]86)$" AND NOT MSVC)
  check_c_compiler_flag(-mno-amx-int8 HARNESS_CC_KNOWS_AMX)
endif()
if(HARNESS_CC_KNOWS_AMX)
  foreach(lang C CXX)
    if(NOT CMAKE_${lang}_FLAGS MATCHES "-mno-amx-int8")
      string(APPEND CMAKE_${lang}_FLAGS " -mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
    endif()
  endforeach()
endif()
