/* SPDX-License-Identifier: Apache-2.0 */
/* How many TCP segments a connection received, for tests that check how
 * a node's messages went out (glibc's struct tcp_info lacks the count;
 * the kernel's header clashes with glibc's, so it is read apart). */
#ifndef GSHM_TEST_CLUSTER_TCP_SEGS_H
#define GSHM_TEST_CLUSTER_TCP_SEGS_H

/* Segments connected TCP socket fd has received (acknowledgements
 * included: the kernel's tcpi_segs_in, Linux 4.2 on), or -1 (errno set). */
long tcp_segs_in(int fd);

#endif
