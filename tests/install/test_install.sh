#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A new user's install: `cmake --install` of this build into a scratch
# DESTDIR, then
#   - the installed gshmctl and gshmd run without LD_LIBRARY_PATH (RUNPATH
#     $ORIGIN/../lib) and say the project's version;
#   - gshmd names the config file it reads by default (the prefix's etc);
#   - a consumer project builds and runs against the installed tree with
#     CMake (find_package(gshm VERSION), gshm::gshm) and with pkg-config,
#     the latter without LD_LIBRARY_PATH (-Wl,-rpath in `pkg-config --libs`);
#   - find_package(gshm 99.0) is refused (gshmConfigVersion.cmake);
#   - `cmake --install --prefix P` to another prefix puts the units, the
#     tmpfiles.d and sysusers.d snippets and gshmd.conf under P (the
#     configuration where GNUInstallDirs puts it for P), the unit runs P's
#     gshmd with P's gshmd.conf, and every file of both installs lies in
#     the DESTDIR (the host is left untouched).
#   test_install.sh BUILD_DIR PREFIX VERSION C_COMPILER RUNPATH
# RUNPATH is ON, or OFF where the prefix puts libgshm in a system library
# directory (/usr): then the programs carry none and run with the
# library on the loader's path (here LD_LIBRARY_PATH, the tree being a
# DESTDIR).
set -u
build=$1 prefix=$2 version=$3 cc=$4 runpath=${5:-ON}
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
root=$dir/root
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

DESTDIR=$root cmake --install "$build" >"$dir/install.log" 2>&1 || {
  cat "$dir/install.log"
  echo "FAIL: cmake --install"
  exit 1
}
p=$root$prefix
# multiarch or not: where libgshm.so landed
lib=$(dirname "$(find "$p" -name 'libgshm.so' | head -1)")
[ -f "$lib/cmake/gshm/gshmConfig.cmake" ] || fail "no gshmConfig.cmake in $lib/cmake/gshm"
[ -f "$lib/cmake/gshm/gshmConfigVersion.cmake" ] || fail "no gshmConfigVersion.cmake"

# RUNPATH, and the version from the one place
if [ "$runpath" = ON ]; then
  libenv=(env -u LD_LIBRARY_PATH)
else
  libenv=(env LD_LIBRARY_PATH="$lib")
fi
out=$("${libenv[@]}" "$p/bin/gshmctl" --version 2>&1) || fail "installed gshmctl: $out"
[ "$out" = "gshmctl $version" ] || fail "installed gshmctl --version: $out"
out=$("${libenv[@]}" "$p/sbin/gshmd" --version 2>&1) || fail "installed gshmd: $out"
[ "$out" = "gshmd $version" ] || fail "installed gshmd --version: $out"
if command -v readelf >/dev/null; then
  if [ "$runpath" = ON ]; then
    readelf -d "$p/bin/gshmctl" | grep -q 'R.*PATH.*\$ORIGIN/\.\./lib' ||
      fail "gshmctl has no \$ORIGIN/../lib RUNPATH: $(readelf -d "$p/bin/gshmctl" | grep PATH)"
  elif readelf -d "$p/bin/gshmctl" | grep -q 'R.*PATH'; then
    fail "gshmctl under $prefix has an RPATH: $(readelf -d "$p/bin/gshmctl" | grep PATH)"
  fi
fi
# the config path the README states for this prefix (GNUInstallDirs)
case $prefix in
/usr) want_conf=/etc/gshm/gshmd.conf ;;
/opt/*) want_conf=/etc$prefix/gshm/gshmd.conf ;;
*) want_conf=$prefix/etc/gshm/gshmd.conf ;;
esac
"${libenv[@]}" "$p/sbin/gshmd" --help 2>&1 | grep -qF "$want_conf" ||
  fail "gshmd --help does not name $want_conf"
# an admin's edits to gshmd.conf outlive a reinstall (an upgrade): the
# shipped file replaced them
[ -f "$root$want_conf" ] || fail "no $want_conf installed"
echo "# an admin's line" >>"$root$want_conf"
DESTDIR=$root cmake --install "$build" >"$dir/install2.log" 2>&1 || fail "cmake --install again"
grep -qxF "# an admin's line" "$root$want_conf" || fail "a reinstall replaced the edited $want_conf"
grep -qF "Keeping: $root$want_conf" "$dir/install2.log" || fail "install: $(cat "$dir/install2.log")"

# a consumer project
mkdir -p "$dir/consumer"
cat >"$dir/consumer/main.c" <<'C'
#include <gshm.h>
#include <stdio.h>
#include <string.h>
int main(void) {
  /* no daemon needed: a call that only formats, and a version macro */
  printf("gshm %d.%d: %s\n", GSHM_VERSION_MAJOR, GSHM_VERSION_MINOR, gshm_strerror(-2));
  return strlen(gshm_strerror(-2)) ? 0 : 1;
}
C
cat >"$dir/consumer/CMakeLists.txt" <<C
cmake_minimum_required(VERSION 3.16)
project(gshm_consumer C)
find_package(gshm \${WANT} REQUIRED)
add_executable(consumer main.c)
target_link_libraries(consumer PRIVATE gshm::gshm)
C
if cmake -S "$dir/consumer" -B "$dir/cb" -DCMAKE_C_COMPILER="$cc" -DWANT="$version" \
     -DCMAKE_PREFIX_PATH="$p" >"$dir/cmake.log" 2>&1 &&
   cmake --build "$dir/cb" >>"$dir/cmake.log" 2>&1; then
  # (its exit status too: in a pipeline into grep it was lost)
  out=$("$dir/cb/consumer") || fail "the CMake consumer exited $?: $out"
  [[ $out == "gshm "*": "?* ]] || fail "the CMake consumer printed '$out'"
else
  cat "$dir/cmake.log"
  fail "a consumer with find_package(gshm $version) did not build"
fi
if cmake -S "$dir/consumer" -B "$dir/cb99" -DCMAKE_C_COMPILER="$cc" -DWANT=99.0 \
     -DCMAKE_PREFIX_PATH="$p" >"$dir/cmake99.log" 2>&1; then
  fail "find_package(gshm 99.0) was accepted"
fi
# pkg-config, from the installed .pc, which names the prefix (the DESTDIR
# tree is read through PKG_CONFIG_SYSROOT_DIR); where the programs carry a
# RUNPATH, so does what `pkg-config --libs` builds
export PKG_CONFIG_PATH=$lib/pkgconfig
[ "$(pkg-config --variable=prefix gshm)" = "$prefix" ] ||
  fail "gshm.pc's prefix is $(pkg-config --variable=prefix gshm), not $prefix"
export PKG_CONFIG_SYSROOT_DIR=$root
if flags=$(pkg-config --cflags --libs gshm); then
  [ "$(pkg-config --modversion gshm)" = "$version" ] || fail "pkg-config --modversion"
  if [ "$runpath" = ON ]; then
    case $flags in *-Wl,-rpath,*) ;; *) fail "pkg-config --libs gshm has no -Wl,-rpath: $flags" ;; esac
  fi
  # shellcheck disable=SC2086
  if "$cc" -o "$dir/pc" "$dir/consumer/main.c" $flags; then
    out=$("${libenv[@]}" "$dir/pc") ||
      fail "the pkg-config consumer did not run without LD_LIBRARY_PATH (exit $?, $flags): $out"
    [[ $out == "gshm "*": "?* ]] || fail "the pkg-config consumer printed '$out'"
  else
    fail "the pkg-config consumer did not build ($flags)"
  fi
else
  fail "pkg-config gshm"
fi
unset PKG_CONFIG_SYSROOT_DIR
# installed to /usr, gshm.pc adds no -I or -L (pkg-config drops the system
# directories; a prefix of ${pcfiledir}/../.. gave
# -I/usr/lib/pkgconfig/../../include, which it keeps)
DESTDIR=$dir/usr-root cmake --install "$build" --prefix /usr >"$dir/install-usr.log" 2>&1 ||
  fail "cmake --install --prefix /usr: $(cat "$dir/install-usr.log")"
usr_pc=$(find "$dir/usr-root" -name gshm.pc | head -1)
if [ -z "$usr_pc" ]; then
  fail "--prefix /usr: no gshm.pc installed"
else
  flags=$(PKG_CONFIG_PATH=$(dirname "$usr_pc") pkg-config --cflags --libs-only-L --libs-only-l gshm)
  [ "$(echo $flags)" = "-lgshm" ] || fail "--prefix /usr: pkg-config --cflags --libs gshm: $flags"
fi

# the same build installed to another prefix: the system files follow it
alt=/opt/gshm-install-test-$$
case $prefix in /opt/gshm-install-test-*) alt=/srv/gshm-install-test-$$ ;; esac
[ -e "$alt" ] && fail "$alt exists on this host before the test"
DESTDIR=$root cmake --install "$build" --prefix "$alt" >"$dir/install-alt.log" 2>&1 || {
  cat "$dir/install-alt.log"
  fail "cmake --install --prefix $alt"
}
case $alt in
/opt/*) alt_conf=/etc$alt/gshm ;;
*) alt_conf=$alt/etc/gshm ;;
esac
for f in "$alt/sbin/gshmd" "$alt/lib/systemd/system/gshmd.service" \
         "$alt/lib/systemd/system/gshmd.socket" "$alt/lib/tmpfiles.d/gshm.conf" \
         "$alt/lib/sysusers.d/gshm.conf" "$alt_conf/gshmd.conf"; do
  [ -f "$root$f" ] || fail "--prefix $alt: not installed: $f"
done
[ -d "$root$alt_conf/conf.d" ] || fail "--prefix $alt: no $alt_conf/conf.d"
unit=$root$alt/lib/systemd/system/gshmd.service
grep -qxF "ExecStart=$alt/sbin/gshmd --set daemon.user=gshmd --config $alt_conf/gshmd.conf" "$unit" ||
  fail "--prefix $alt: the unit's $(grep ^ExecStart= "$unit")"
# the configured prefix's unit runs its gshmd with the compiled-in default
grep -rqxF "ExecStart=$prefix/sbin/gshmd --set daemon.user=gshmd" "$root" --include=gshmd.service ||
  fail "no unit for $prefix with ExecStart=$prefix/sbin/gshmd --set daemon.user=gshmd"
# every file the last install names (install_manifest.txt lists them without
# DESTDIR) is in the DESTDIR, and the host has no trace of the new prefix
n=0
while read -r f; do
  n=$((n + 1))
  [ -e "$root$f" ] || fail "installed, but not under DESTDIR: $f"
done <"$build/install_manifest.txt"
[ "$n" -gt 10 ] || fail "install_manifest.txt lists $n files"
grep -q "/gshmd.service$" "$build/install_manifest.txt" || fail "the unit is not in the manifest"
[ -e "$alt" ] || [ -e "/etc$alt" ] && fail "the DESTDIR install wrote $alt or /etc$alt on the host"
[ "$failures" = 0 ] && echo "install: all checks passed ($p)"
exit $((failures > 0))
