/* gshm-bench: one program, one subcommand per file (bench_<name>.c). */
#ifndef GSHM_BENCH_H
#define GSHM_BENCH_H

int bench_copy_main(int argc, char **argv);      /* bench_copy.c */
int bench_broadcast_main(int argc, char **argv); /* bench_broadcast.c */
int bench_attach_main(int argc, char **argv);    /* bench_attach.c */
int bench_control_main(int argc, char **argv);   /* bench_control.c */

#endif
