# cmake -DINPUT=<file> -DOUTPUT=<file> -P RewriteLaunches.cmake
#
# Rewrites the kernel launches of a CUDA source for the host emulator
# (kvc_cuda_emu.h): `k<<<grid, block, smem, stream>>>(args)` becomes
# `k * ::kvc::emu::Launch(__FILE__, __LINE__, grid, block, smem, stream)(args)`
# on the same line, so that the emulator names the launch site. A launch ends
# with `>>>(`; other `>>>` (nested templates) stay. A source whose `<<<` and
# launch ends do not pair up is refused rather than miscompiled.
if(NOT INPUT OR NOT OUTPUT)
  message(FATAL_ERROR "RewriteLaunches.cmake: INPUT and OUTPUT are required")
endif()
file(READ "${INPUT}" text)
string(REGEX MATCHALL "<<<" opens "${text}")
string(REGEX MATCHALL ">>>[ \t\r\n]*\\(" closes "${text}")
list(LENGTH opens num_opens)
list(LENGTH closes num_closes)
if(NOT num_opens EQUAL num_closes)
  message(FATAL_ERROR "RewriteLaunches.cmake: ${INPUT} has ${num_opens} "
    "'<<<' but ${num_closes} '>>>('; only kernel launches may use them")
endif()
string(REPLACE "<<<" " * ::kvc::emu::Launch(__FILE__, __LINE__, " text "${text}")
string(REGEX REPLACE ">>>([ \t\r\n]*)\\(" ")\\1(" text "${text}")
file(WRITE "${OUTPUT}.tmp" "${text}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
