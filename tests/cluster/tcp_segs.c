/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_segs.h: the kernel's struct tcp_info, apart from glibc's. */
#include <linux/tcp.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "tcp_segs.h"

long tcp_segs_in(int fd) {
  struct tcp_info ti = {0};
  socklen_t len = sizeof(ti);

  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) < 0)
    return -1;
  return (long)ti.tcpi_segs_in;
}
