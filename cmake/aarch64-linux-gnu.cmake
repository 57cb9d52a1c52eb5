# Cross-build for arm64 Linux with Debian's g++-aarch64-linux-gnu and arm64 multiarch
# libraries (dpkg --add-architecture arm64); tests run under qemu-aarch64 with every optional
# CPU feature (-cpu max: dotprod, i8mm, fp16), so the NEON paths are exercised.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")
# The arm64 multiarch libc (libc6:arm64) is found through /lib/ld-linux-aarch64.so.1; mixing
# it with the cross sysroot (qemu -L /usr/aarch64-linux-gnu) hangs in pthread_create.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64;-cpu;max)
