# SPDX-License-Identifier: Apache-2.0
"""Whose segment a reader trusts with the bytes it uses as data.

Names are first come, first served: any user that may create names may
create the one a publisher will use (a prefix's manifest or segments, a
shared state dict's name) before the publisher does, or after an unlink,
with bytes of its own.  A reader therefore pins the owner: a segment is
taken only when it is that owner's (by default the reader's own uid, as
gshmd knows its connection) and neither its group nor others may write it,
checked on the daemon's record of the very segment leased (Segment.stat(),
by id and generation: SegmentInfo), not on a second lookup by name.  Not
on the record the lease came with (seg.info): libgshm serves a second open
of a name this client already holds from that lease, and seg.info is then
the first open's record, from before any chmod or chown since.  gshm.torch.attach (through gshm._manifest),
gshm.torch.load_state_dict and gshm._safetensors.load_arrays use it;
Client.open, the raw primitive, checks nothing.

The check is made once, at open, and not again: a chmod or chown by the
owner afterwards is not seen, and the reader is not told (leases are kept
as granted, as open files are).  A later check could not protect it
anyway: the bytes are mapped and read at any time, and whoever opened the
segment for writing between two checks keeps that lease.  The owner is
trusted with the bytes (it may write them itself): an owner that lets
others write a segment readers use hands them that trust.  To check
again, open (attach, load) again.

This module imports nothing else of gshm, so that _safetensors and
_manifest (which imports _safetensors) may both use it."""

import pwd
import reprlib

__all__ = ["ManifestError", "UntrustedSegment", "owner_uid", "check_owner", "check_segment",
           "open_owned"]


class ManifestError(ValueError):
    """The manifest is not one gshm wrote, or does not fit its segments.
    (Defined here for UntrustedSegment; gshm._manifest exports it.)"""


class UntrustedSegment(ManifestError):
    """A segment whose bytes a reader would use as data (a prefix's manifest
    or a segment it names, for attach; the one name of load_state_dict or
    load_arrays) is not the expected owner's, or others than its owner may
    write it: names are first come, first served, so another user may have
    created it."""


def _user(uid):
    """"uid N (name)" for messages; "uid N" where this process's user
    database has no such uid."""
    try:
        return "uid %d (%s)" % (uid, pwd.getpwuid(uid).pw_name)
    except (KeyError, OverflowError):
        return "uid %d" % uid


def owner_uid(client, owner=None):
    """The uid whose segments a reader trusts: owner, a uid (int, as gshmd
    knows it: `gshmctl segments` shows it) or a user name (looked up in
    this process's user database: in a user namespace, pass the outer uid);
    None: the uid gshmd knows client by (Client.uid()), the reader's own.
    Raises TypeError for another type, ValueError for a uid outside
    [0, 2**32 - 2] or a name with no user."""
    if owner is None:
        return client.uid()
    if isinstance(owner, bool) or not isinstance(owner, (int, str)):
        raise TypeError("gshm: owner must be a uid (int) or a user name (str), not %s"
                        % type(owner).__name__)
    if isinstance(owner, str):
        try:
            return pwd.getpwnam(owner).pw_uid
        except KeyError:
            raise ValueError("gshm: owner %s: no user named so here"
                             % reprlib.repr(owner)) from None
    if not 0 <= owner < (1 << 32) - 1:  # ((uid_t)-1 is no one's)
        raise ValueError("gshm: owner %d is not a uid" % owner)
    return owner


def check_owner(info, uid, what="segment"):
    """Refuses a segment (its SegmentInfo, as the daemon gave it with the
    lease) that uid does not own, or whose group or others may write it
    (mode 0o022: they could change its bytes under the reader).  info is
    one record of it: check_segment() gives the one of now.  Raises
    UntrustedSegment naming the segment, its owner and the expected one."""
    if info.uid != uid:
        raise UntrustedSegment(
            "gshm: %s %r is owned by %s; this reader expects %s (its owner= argument, by "
            "default the reader's own uid): another user may have created the name first, and "
            "its bytes are refused as weights" % (what, info.name, _user(info.uid), _user(uid)))
    if info.mode & 0o022:
        raise UntrustedSegment(
            "gshm: %s %r of %s has mode %04o: others than its owner may write it, so its "
            "bytes are refused as weights" % (what, info.name, _user(info.uid), info.mode & 0o7777))


def check_segment(seg, uid, what="segment"):
    """check_owner() on the daemon's record of open segment seg now
    (seg.stat(): one request), not on seg.info, which a lease this client
    already held gave (libgshm's lease cache) before a chmod or chown.
    Raises UntrustedSegment as check_owner(), and the errors of
    Segment.stat() (gshm.PermissionDenied: the owner changed the mode so
    that this client may no longer see it; gshm.Revoked: revoked)."""
    check_owner(seg.stat(), uid, what)


def open_owned(client, name, access="r", owner=None, what="segment"):
    """Opens segment `name` whose bytes the caller uses as data (weights,
    arrays) and checks it as attach() checks a prefix: check_owner() on
    the SegmentInfo the lease came with (no second lookup by name that a
    re-created name could race; check_segment(): its record now, not the
    one a cached lease gave).  access: "r" or "rw", as Client.open;
    owner: as owner_uid() (None: the uid gshmd knows client by, the
    reader's own); what: the segment's kind in messages.  Returns the open
    Segment, the caller's to close.  Raises TypeError / ValueError for an
    owner that is no uid or user (before anything is opened), the errors
    of Client.open (gshm.NotFound, gshm.PermissionDenied, ...),
    UntrustedSegment for another owner's segment or one that its group or
    others may write (the lease given back first)."""
    uid = owner_uid(client, owner)
    seg = client.open(name, access)
    try:
        check_segment(seg, uid, what)
    except BaseException:
        seg.close()
        raise
    return seg
