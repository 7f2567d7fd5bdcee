# cmake -DINPUT=<file> -DOUTPUT=<file> [-DROOT=<dir>] -P RewriteLaunches.cmake
#
# Rewrites the kernel launches of a CUDA source for the host emulator
# (kvc_cuda_emu.h): `k<<<grid, block, smem, stream>>>(args)` becomes
# `k * ::kvc::emu::Launch(__FILE__, __LINE__, ::kvc::emu::kernelName<k>(),
# grid, block, smem, stream)(args)` on the same line, so that the emulator
# names the launch site and the kernel. `k` is the identifier (qualified or
# not) right before `<<<`, with the template argument list before it where
# one stands on the same line without nested brackets or parentheses
# (`storeAppended<D, S><<<`); a launch whose kernel is another expression
# is named "?". A launch ends
# with `>>>(`; other `>>>` (nested templates) stay. A source whose `<<<` and
# launch ends do not pair up is refused rather than miscompiled. The output
# starts with a #line directive naming the input (relative to ROOT, the
# source tree, where given: the output's bytes, and so ccache's entries,
# are then the same in every checkout), so that __FILE__, the compiler's
# diagnostics and the sanitizers' reports name the source and its lines.
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
# The template arguments' group is an alternative with the empty string
# rather than optional: CMake refuses a replacement that names a group
# which took no part in the match.
string(REGEX REPLACE "([A-Za-z_][A-Za-z0-9_:]*)(<[^<>;{}()\r\n]*>|)([ \t\r\n]*)<<<"
  "\\1\\2\\3 * ::kvc::emu::Launch(__FILE__, __LINE__, ::kvc::emu::kernelName<\\1\\2>(), "
  text "${text}")
string(REPLACE "<<<" " * ::kvc::emu::Launch(__FILE__, __LINE__, \"?\", " text
  "${text}")
string(REGEX REPLACE ">>>([ \t\r\n]*)\\(" ")\\1(" text "${text}")
set(named "${INPUT}")
if(ROOT)
  file(RELATIVE_PATH named "${ROOT}" "${INPUT}")
endif()
file(WRITE "${OUTPUT}.tmp" "#line 1 \"${named}\"\n${text}")
file(COPY_FILE "${OUTPUT}.tmp" "${OUTPUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUTPUT}.tmp")
