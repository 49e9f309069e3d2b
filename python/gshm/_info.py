# SPDX-License-Identifier: Apache-2.0
"""The read-only records of the daemon's state: segments, leases, clients,
status, devices and their peers (frozen dataclasses built from the C
structs)."""

import dataclasses
import datetime
from typing import Any, Dict, Optional, Tuple

from ._core import _dec, _access_name

__all__ = ["SegmentInfo", "LeaseInfo", "ClientInfo", "StatusInfo", "DeviceInfo", "PeerInfo",
           "ClusterPeer", "PullResult"]


def _ns_to_datetime(ns: int) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ns / 1e9, tz=datetime.timezone.utc)


@dataclasses.dataclass(frozen=True)
class SegmentInfo:
    """gshm_segment_info_t."""
    id: int
    generation: int
    name: str
    size: int             #: bytes allocated (requested rounded up to granularity)
    requested_size: int   #: bytes asked for at create
    granularity: int
    location: str         #: "host" or "cuda:GPU-<uuid>"
    device_index: int     #: the daemon's GPU index; -1 for host
    uid: int
    gid: int
    mode: int
    flags: int
    unlinked: bool
    leases: int
    created_ns: int
    #: pulled from a peer node: "PEER:NAME#ID.GENERATION"; else ""
    source: str = ""

    @classmethod
    def _from_c(cls, c):
        return cls(id=c.id, generation=c.generation, name=_dec(c.name), size=c.size,
                   requested_size=c.requested_size, granularity=c.granularity,
                   location=_dec(c.location), device_index=c.device_index, uid=c.uid,
                   gid=c.gid, mode=c.mode, flags=c.flags, unlinked=bool(c.unlinked),
                   leases=c.leases, created_ns=c.created_ns, source=_dec(c.source))

    @property
    def is_host(self) -> bool:
        return self.location == "host"

    @property
    def gpu_uuid(self) -> Optional[str]:
        """"GPU-<uuid>" of a device segment's GPU, None for host segments."""
        if self.location.startswith("cuda:"):
            rest = self.location[5:]
            if rest.upper().startswith("GPU-"):
                return rest
        return None

    @property
    def created(self) -> datetime.datetime:
        return _ns_to_datetime(self.created_ns)

    def asdict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class LeaseInfo:
    """gshm_lease_info_t: one client connection's open of one segment."""
    lease_id: int
    segment_id: int
    segment: str
    location: str
    session_id: int
    pid: int
    uid: int
    client: str
    access: str           #: "r" or "rw"
    since_ns: int
    mapped: bool
    devices: tuple        #: GPU UUIDs it mapped on, the first 6 at most; () for CPU or unmapped
    devices_total: int = 0  #: GPUs it mapped on in all (more than len(devices): some left out)

    @classmethod
    def _from_c(cls, c):
        devs = _dec(c.mapped_devices)
        return cls(lease_id=c.lease_id, segment_id=c.segment_id, segment=_dec(c.segment_name),
                   location=_dec(c.location), session_id=c.session_id, pid=c.pid, uid=c.uid,
                   client=_dec(c.client_name), access=_access_name(c.access),
                   since_ns=c.since_ns, mapped=bool(c.mapped),
                   devices=tuple(d for d in devs.split(",") if d),
                   devices_total=c.mapped_devices_total)

    @property
    def since(self) -> datetime.datetime:
        return _ns_to_datetime(self.since_ns)

    def asdict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClientInfo:
    """gshm_client_info_t: one client connection."""
    session_id: int
    pid: int
    uid: int
    gid: int
    name: str
    since_ns: int
    leases: int

    @classmethod
    def _from_c(cls, c):
        return cls(session_id=c.session_id, pid=c.pid, uid=c.uid, gid=c.gid, name=_dec(c.name),
                   since_ns=c.since_ns, leases=c.leases)

    def asdict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class StatusInfo:
    """gshm_status_info_t: the daemon as a whole."""
    version: str
    pid: int
    started_ns: int
    clients: int
    segments: int
    leases: int
    devices: int
    bytes: int
    backends: Tuple[str, ...]  #: ("host",), ("host", "cuda")
    #: "" normally; while a sticky CUDA error at gshmd's start leaves the GPUs
    #: unusable, what it was ("0000:18:00.0: CUDA_ERROR_ECC_UNCORRECTABLE"),
    #: or "no driver: " and why where its CUDA driver did not start while
    #: it held device segments
    gpu_fault: str = ""

    @classmethod
    def _from_c(cls, c):
        return cls(version=_dec(c.version), pid=c.pid, started_ns=c.started_ns, clients=c.clients,
                   segments=c.segments, leases=c.leases, devices=c.devices, bytes=c.bytes,
                   backends=tuple(b for b in _dec(c.backends).split(",") if b),
                   gpu_fault=_dec(c.gpu_fault))

    def asdict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PeerInfo:
    """gshm_peer_info_t: reachability of one GPU from another (daemon indexes)."""
    index: int
    access: bool
    native_atomics: bool
    performance_rank: int
    nvlinks: int          #: -1 unknown

    @classmethod
    def _from_c(cls, c):
        return cls(index=c.index, access=bool(c.access), native_atomics=bool(c.native_atomics),
                   performance_rank=c.performance_rank, nvlinks=c.nvlinks)


@dataclasses.dataclass(frozen=True)
class DeviceInfo:
    """gshm_device_info_t: one GPU as gshmd enumerated it."""
    index: int            #: the daemon's index: location "cuda:N"
    uuid: str
    pci_bus_id: str
    name: str
    total_memory: int
    free_memory: int
    granularity: int
    cc_major: int
    cc_minor: int
    peers: tuple          #: PeerInfo

    @classmethod
    def _from_c(cls, c):
        n = max(0, min(c.npeers, len(c.peers)))
        return cls(index=c.index, uuid=_dec(c.uuid), pci_bus_id=_dec(c.pci_bus_id),
                   name=_dec(c.name), total_memory=c.total_memory, free_memory=c.free_memory,
                   granularity=c.granularity, cc_major=c.cc_major, cc_minor=c.cc_minor,
                   peers=tuple(PeerInfo._from_c(c.peers[i]) for i in range(n)))

    @property
    def location(self) -> str:
        return "cuda:" + self.uuid

    def asdict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class ClusterPeer:
    """gshm_cluster_peer_t: a peer node of the daemon's cluster."""
    name: str
    address: str
    state: str            #: "up", "connecting" or "down"
    exported: int         #: segments it exports, as last seen
    message: str          #: why it is down, if known
    #: an up peer's cluster protocol as its hello announced it ("2.6");
    #: None: not up, or a gshmd or libgshm before it
    protocol: Optional[str] = None
    #: an up peer: its link uses the cluster key's subkeys (both 2.6); else None
    subkeys: Optional[bool] = None

    @classmethod
    def _from_c(cls, c):
        known = c.protocol_major != 0
        return cls(name=_dec(c.name), address=_dec(c.address), state=_dec(c.state),
                   exported=c.exported, message=_dec(c.message),
                   protocol=f"{c.protocol_major}.{c.protocol_minor}" if known else None,
                   subkeys=bool(c.subkeys) if known else None)


@dataclasses.dataclass(frozen=True)
class PullResult:
    """gshm_pull_result_t: what a pull did."""
    segment: SegmentInfo  #: the new local segment
    bytes: int
    elapsed_ns: int
    path: str             #: "host", "direct" or "staged"
    path_reason: str
    peer: str             #: the node it was read from
    remote_id: int        #: its id on peer; 0 when relayed
    remote_generation: int
    remote_name: str      #: its name on peer
    #: peer was still pulling it (fan-out); segment.source says where it came from first
    relayed: bool

    @property
    def gb_per_s(self) -> float:
        return self.bytes / self.elapsed_ns if self.elapsed_ns else 0.0

    @classmethod
    def _from_c(cls, c):
        return cls(segment=SegmentInfo._from_c(c.segment), bytes=c.bytes, elapsed_ns=c.elapsed_ns,
                   path=_dec(c.path), path_reason=_dec(c.path_reason), peer=_dec(c.peer),
                   remote_id=c.remote_id, remote_generation=c.remote_generation,
                   remote_name=_dec(c.remote_name), relayed=bool(c.relayed))
