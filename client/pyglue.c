/* SPDX-License-Identifier: Apache-2.0 */
/* A DLPack deleter and a PyCapsule destructor in C for a binding with no
 * compiled code of its own (the Python package's gshm._dlpack, ctypes).
 *
 * ctypes can give C only Python functions, and a ctypes callback entered
 * while a Python exception is pending loses it: the interpreter's check of
 * the callback's result turns it into a SystemError, which ctypes reports
 * as unraisable and clears.  Consumers drop a capsule with their exception
 * set (numpy.from_dlpack of a GPU view: "Unsupported device"), and free a
 * tensor on the way out of a failed call: the caller then got a
 * SystemError ("returned NULL without setting an exception") instead of
 * the consumer's error, and the callback's work (the export's release,
 * which ends the lease) never ran.  Here the pending exception is set
 * aside around the callback (PyErr_Fetch, PyErr_Restore), as CPython does
 * around weakref callbacks.
 *
 * The glue is process-wide: a deleter's one argument is the tensor, a
 * destructor's the capsule, and neither can carry it. */
#include <errno.h>

#include "gshm.h"

static const gshm_py_glue_t *py_glue;

int gshm_py_glue_set(const gshm_py_glue_t *glue) {
  if (!glue || !glue->gil_ensure || !glue->gil_release || !glue->err_fetch ||
      !glue->err_restore || !glue->deleter || !glue->capsule_destructor)
    return -EINVAL;
  __atomic_store_n(&py_glue, glue, __ATOMIC_RELEASE);
  return 0;
}

/* fn(arg) with the GIL held and Python's pending exception set aside. */
static void call_keeping_error(const gshm_py_glue_t *g, void (*fn)(void *), void *arg) {
  void *type, *value, *traceback;
  int state = g->gil_ensure();

  g->err_fetch(&type, &value, &traceback);
  fn(arg);
  g->err_restore(type, value, traceback);
  g->gil_release(state);
}

void gshm_py_dlpack_deleter(void *managed) {
  const gshm_py_glue_t *g = __atomic_load_n(&py_glue, __ATOMIC_ACQUIRE);

  if (g)
    call_keeping_error(g, g->deleter, managed);
}

void gshm_py_capsule_destructor(void *capsule) {
  const gshm_py_glue_t *g = __atomic_load_n(&py_glue, __ATOMIC_ACQUIRE);

  if (g)
    call_keeping_error(g, g->capsule_destructor, capsule);
}
