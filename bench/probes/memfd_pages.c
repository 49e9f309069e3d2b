/* SPDX-License-Identifier: Apache-2.0 */
/* memfd_pages: how fast this machine makes the pages of new host memory
 * (docs/PERFORMANCE.md "Pulls from a peer gshmd", the page table there).
 * An experiment, kept so that its numbers can be reproduced; not built
 * with the project:
 *
 *   gcc -O2 -pthread -o memfd_pages bench/probes/memfd_pages.c
 *   ./memfd_pages [GIB [NTHREADCOUNTS]]   # e.g. 4 5: 1, 2, 4, 8, 16 threads
 *
 * Each row: new memory of GIB GiB, its pages made by T threads (disjoint
 * ranges) by touching, MADV_POPULATE_WRITE, fallocate or pwrite; then one
 * memset over it (warm). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <fcntl.h>
#include <unistd.h>
#include <time.h>
#include <stdint.h>
#include <errno.h>
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
enum {M_TOUCH, M_FALLOC, M_POP, M_PWRITE, M_FPOP};
struct job{char*p;int fd;size_t off,len;int mode;};
static void*run(void*a){struct job*j=a;
 if(j->mode==M_TOUCH){for(size_t i=0;i<j->len;i+=4096)j->p[j->off+i]=1;}
 else if(j->mode==M_FALLOC){for(size_t o=0;o<j->len;o+=(2<<20)) if(fallocate(j->fd,0,j->off+o,2<<20)){perror("falloc");break;}}
 else if(j->mode==M_PWRITE){static __thread char*buf; if(!buf){buf=malloc(1<<20);memset(buf,3,1<<20);}
   for(size_t o=0;o<j->len;o+=(1<<20)) if(pwrite(j->fd,buf,1<<20,j->off+o)!=(1<<20)){perror("pwrite");break;}}
 else if(j->mode==M_FPOP){if(fallocate(j->fd,0,j->off,j->len))perror("f");if(madvise(j->p+j->off,j->len,MADV_POPULATE_WRITE))perror("pop");}
 else {if(madvise(j->p+j->off,j->len,MADV_POPULATE_WRITE))perror("pop");}
 return 0;}
static void test(const char*name,size_t total,int T,int sep,int anon,int mode,int adv, unsigned mfd_flags){
 pthread_t th[64];struct job jb[64];char*base[64];int fds[64];
 size_t per=total/T; int nobj=sep?T:1;
 for(int i=0;i<nobj;i++){size_t sz=sep?per:total;
  if(anon){base[i]=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_PRIVATE|MAP_ANONYMOUS,-1,0);fds[i]=-1;}
  else{fds[i]=memfd_create("p",mfd_flags); if(fds[i]<0){printf("%-34s memfd_create: %s\n",name,strerror(errno));return;}
   if(ftruncate(fds[i],sz)){printf("%s ftruncate %s\n",name,strerror(errno));return;}
   base[i]=mmap(0,sz,PROT_READ|PROT_WRITE,MAP_SHARED,fds[i],0);}
  if(base[i]==MAP_FAILED){printf("%s mmap %s\n",name,strerror(errno));return;}
  if(adv) madvise(base[i],sz,adv);
 }
 double t0=now();
 for(int i=0;i<T;i++){jb[i]=(struct job){sep?base[i]:base[0],sep?fds[i]:fds[0],sep?0:i*per,per,mode};pthread_create(&th[i],0,run,&jb[i]);}
 for(int i=0;i<T;i++)pthread_join(th[i],0);
 double t=now()-t0;
 /* warm rewrite */
 double t1=now(); for(int i=0;i<T;i++){jb[i].mode=M_TOUCH;} 
 for(int i=0;i<nobj;i++) memset(base[i],2,sep?per:total);
 double tw=now()-t1;
 printf("%-34s T=%2d %6.2f GB/s  (warm memset 1 thread %5.2f GB/s)\n",name,T,total/t/1e9,total/tw/1e9);
 for(int i=0;i<nobj;i++){munmap(base[i],sep?per:total); if(fds[i]>=0)close(fds[i]);}
}
int main(int c,char**v){size_t total=(size_t)(c>1?atoi(v[1]):4)<<30;
 int Ts[]={1,2,4,8,16};int nt=c>2?atoi(v[2]):5;
 for(int k=0;k<nt;k++){int T=Ts[k];
  test("memfd one, touch",total,T,0,0,M_TOUCH,0,0);
  test("memfd one, fallocate 2M",total,T,0,0,M_FALLOC,0,0);
  test("memfd one, POPULATE_WRITE",total,T,0,0,M_POP,0,0);
  test("memfd one, pwrite 1M",total,T,0,0,M_PWRITE,0,0);
  test("memfd per thread, pwrite 1M",total,T,1,0,M_PWRITE,0,0);
  test("memfd one, fallocate+POPULATE",total,T,0,0,M_FPOP,0,0);
  test("memfd per thread, touch",total,T,1,0,M_TOUCH,0,0);
  test("memfd per thread, fallocate",total,T,1,0,M_FALLOC,0,0);
  test("memfd one, MADV_HUGEPAGE touch",total,T,0,0,M_TOUCH,MADV_HUGEPAGE,0);
  test("anon nohuge, touch",total,T,1,1,M_TOUCH,MADV_NOHUGEPAGE,0);
  test("anon hugepage, touch",total,T,1,1,M_TOUCH,MADV_HUGEPAGE,0);
  test("memfd HUGETLB 2M, touch",total,T,0,0,M_TOUCH,0,MFD_HUGETLB|(21<<26));
 }
}
