/* SPDX-License-Identifier: Apache-2.0 */
/* tcp_into_memfd: K plain TCP connections on 127.0.0.1 moving SIZE MiB in
 * 4 MiB chunks into NSEG new memfds, the receivers writing one of five
 * ways (docs/PERFORMANCE.md "Pulls from a peer gshmd").  An experiment,
 * kept so that its numbers can be reproduced; not built with the project:
 *
 *   gcc -O2 -pthread -o tcp_into_memfd bench/probes/tcp_into_memfd.c
 *   ./tcp_into_memfd SIZE_MIB NSEG MODE K [P]
 *
 * MODE 0: recv into the mapping; 1: recv into a warm buffer, then pwrite;
 * 2: as 1 with a thread fallocating ahead; 3: into memory mapped and
 * written before; 4: fallocate ahead, recv into the mapping; 5:
 * MADV_POPULATE_WRITE each chunk, then recv.  P > 1: P transfers at once
 * (processes), each printing its median. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <stdint.h>
#include <errno.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define CH (4u<<20)
static int K=8; static size_t SIZE; static int NSEG; static int MODE;
/* MODE 0: recv into mapping; 1: recv into bounce + pwrite; 2: fallocate thread ahead + 1; 3: warm mapping; 4: fallocate ahead + recv into mapping*/
static int *segfd; static char **segmap; static size_t segsz;
static int lfd; static char *sbuf;
struct th{int id;int fd;pthread_t t;};
static void *sender(void*a){struct th*t=a; size_t nch=SIZE/CH;
 for(size_t c=t->id;c<nch;c+=K){size_t o=0;while(o<CH){ssize_t w=send(t->fd,sbuf+o,CH-o,0);if(w<=0){perror("send");exit(1);}o+=w;}}
 return 0;}
static void rd(int fd,char*p,size_t n){while(n){ssize_t r=recv(fd,p,n,MSG_WAITALL);if(r<=0){perror("recv");exit(1);}p+=r;n-=r;}}
static void *receiver(void*a){struct th*t=a; size_t nch=SIZE/CH; char*b=NULL;
 if(MODE==1||MODE==2){b=aligned_alloc(4096,CH);memset(b,0,CH);}
 for(size_t c=t->id;c<nch;c+=K){size_t off=c*CH; int s=off/segsz; size_t so=off%segsz;
  if(MODE==1||MODE==2){rd(t->fd,b,CH); if(pwrite(segfd[s],b,CH,so)!=CH){perror("pwrite");exit(1);}}
  else { if(MODE==5) madvise(segmap[s]+so,CH,23); rd(t->fd,segmap[s]+so,CH);} }
 return 0;}
static void *falloc(void*a){for(int s=0;s<NSEG;s++) fallocate(segfd[s],0,0,segsz);return 0;}
static int main1(int c,char**v);
#include <sys/wait.h>
int main(int c,char**v){int P=c>5?atoi(v[5]):1; if(P==1)return main1(c,v);
 double t0=now(); for(int i=0;i<P;i++) if(!fork()){exit(main1(c,v));} for(int i=0;i<P;i++)wait(0); printf("P=%d all: %.3f s\n",P,now()-t0); return 0;}
static int main1(int c,char**v){SIZE=(size_t)atoll(v[1])<<20;NSEG=atoi(v[2]);MODE=atoi(v[3]);K=atoi(v[4]);segsz=SIZE/NSEG;
 sbuf=malloc(CH);for(size_t i=0;i<CH;i++)sbuf[i]=i*7;
 segfd=calloc(NSEG,sizeof(int));segmap=calloc(NSEG,sizeof(char*));
 struct sockaddr_in sa={.sin_family=AF_INET,.sin_addr.s_addr=htonl(INADDR_LOOPBACK)};
 lfd=socket(AF_INET,SOCK_STREAM,0);bind(lfd,(void*)&sa,sizeof sa);listen(lfd,64);socklen_t sl=sizeof sa;getsockname(lfd,(void*)&sa,&sl);
 struct th S[32],R[32];
 for(int i=0;i<K;i++){S[i].id=i;S[i].fd=socket(AF_INET,SOCK_STREAM,0);connect(S[i].fd,(void*)&sa,sizeof sa);R[i].id=i;R[i].fd=accept(lfd,0,0);}
 double best[8];int it=5;
 for(int r=0;r<it;r++){
  for(int s=0;s<NSEG;s++){ if(r==0||MODE!=3){ if(segmap[s]){munmap(segmap[s],segsz);close(segfd[s]);}
    segfd[s]=memfd_create("s",0);ftruncate(segfd[s],segsz);segmap[s]=mmap(0,segsz,PROT_READ|PROT_WRITE,MAP_SHARED,segfd[s],0);
    if(MODE==3)memset(segmap[s],1,segsz);}}
  double t0=now(); pthread_t ft;
  if(MODE==2||MODE==4)pthread_create(&ft,0,falloc,0);
  for(int i=0;i<K;i++){pthread_create(&S[i].t,0,sender,&S[i]);pthread_create(&R[i].t,0,receiver,&R[i]);}
  for(int i=0;i<K;i++){pthread_join(S[i].t,0);pthread_join(R[i].t,0);}
  if(MODE==2||MODE==4)pthread_join(ft,0);
  best[r]=SIZE/(now()-t0)/1e9;}
 /* median */ for(int i=0;i<it;i++)for(int j=i+1;j<it;j++)if(best[j]<best[i]){double x=best[i];best[i]=best[j];best[j]=x;}
 printf("size %zu MiB segs %d mode %d K %d: median %.2f GB/s (min %.2f max %.2f)\n",SIZE>>20,NSEG,MODE,K,best[it/2],best[0],best[it-1]);
}
