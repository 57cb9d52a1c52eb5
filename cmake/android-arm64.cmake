# Android arm64-v8a with the NDK (r26 or newer, API 28+). Usage:
#   cmake -S . -B build-android -DCMAKE_TOOLCHAIN_FILE=cmake/android-arm64.cmake \
#         -DANDROID_NDK=/path/to/android-ndk-r26d -DBMOE_BUILD_TESTS=OFF -DBMOE_BUILD_BENCH=OFF
# It wraps the NDK's own toolchain file with bmoe's defaults; see docs/android.md.
if(NOT ANDROID_NDK)
  set(ANDROID_NDK "$ENV{ANDROID_NDK_HOME}")
endif()
if(NOT ANDROID_NDK OR NOT EXISTS "${ANDROID_NDK}/build/cmake/android.toolchain.cmake")
  message(FATAL_ERROR "set ANDROID_NDK (or ANDROID_NDK_HOME) to an Android NDK r26+ directory")
endif()
set(ANDROID_ABI arm64-v8a CACHE STRING "")
set(ANDROID_PLATFORM android-28 CACHE STRING "")
set(ANDROID_STL c++_static CACHE STRING "")
include("${ANDROID_NDK}/build/cmake/android.toolchain.cmake")
