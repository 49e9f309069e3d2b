# SPDX-License-Identifier: Apache-2.0
import os

import pytest

import gshm_testutil


@pytest.fixture(scope="session")
def daemon():
    """A gshmd with the host backend on a temporary socket, for the session."""
    d = gshm_testutil.Daemon(backend=os.environ.get("GSHM_TEST_BACKEND", "host"))
    d.start()
    yield d
    d.stop()


@pytest.fixture
def client(daemon):
    import gshm
    with gshm.Client(daemon.socket, name="pytest") as c:
        yield c


@pytest.fixture
def segname(request):
    """A segment name unique to the test."""
    return "pytest/%d/%s" % (os.getpid(), request.node.name.replace("[", "_").replace("]", ""))
