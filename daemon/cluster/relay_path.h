/* SPDX-License-Identifier: Apache-2.0 */
/* The path of relayed bytes (Grant.upstream): the nodes a segment granted
 * in flight still gets its bytes through, nearest first, as node names
 * separated by commas ("n1,n0"), at most RELAY_PATH_MAX of them, with a
 * last "?" where the rest is not known.  A relay grants in flight only to
 * a peer that is not on the path of what it grants (relay.c relay_serves),
 * so that no ring of relays waits on itself.  Pure functions: the path
 * comes from the wire and is checked here before anything uses it. */
#ifndef GSHMD_CLUSTER_RELAY_PATH_H
#define GSHMD_CLUSTER_RELAY_PATH_H

#include <stdbool.h>

/* The most node names a path holds: a longer chain is passed on as not
 * known ("...,?").  A chain of relays that long is no deployment's. */
#define RELAY_PATH_MAX 8
/* The longest text of a path: RELAY_PATH_MAX names of at most 63 bytes,
 * their commas, ",?" and the NUL. */
#define RELAY_PATH_LEN (RELAY_PATH_MAX * 64 + 3)

/* Whether path (NUL-terminated; "" the empty path) is one as
 * Grant.upstream may hold it: node names (1-63 bytes each, no byte at or
 * below 0x20 nor 0x7f: gshmd__cluster_name_ok's rule, and no comma), at
 * most RELAY_PATH_MAX, separated by single commas, optionally followed
 * by (or being only) "?".  *known_out: false when it ends with "?".
 * Anything else (empty names, "?" before the end, a trailing comma,
 * more names, longer than RELAY_PATH_LEN - 1 bytes) is false. */
bool gshmd__relay_path_ok(const char *path, bool *known_out);
/* Whether node name is one of the names of path (a checked path; "?"
 * matches no name).  Whole names only: "n1" is not on "n10,n0". */
bool gshmd__relay_path_has(const char *path, const char *name);
/* The number of node names in path (a checked path, "?" not counted). */
unsigned gshmd__relay_path_names(const char *path);

#endif
