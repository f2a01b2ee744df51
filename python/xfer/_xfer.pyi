"""Type stubs of xfer._xfer, the extension module behind the package xfer."""

import enum
from typing import Any, Iterator, Optional, Sequence, Tuple, Union

_Seconds = Optional[float]
_Message = Union[bytes, str]
_Descs = Union[Sequence[Tuple[int, int, int]], Any]  # triples, or an (N, 3) integer array
_Column = Union[Sequence[int], Any]                   # a 1-D integer array or a list of ints

class State(enum.Enum):
    WAITING: int
    COMPLETED: int
    FAILED: int
    TIMEOUT: int
    CANCELED: int

class Outcome(enum.Enum):
    COMPLETED: int
    FAILED: int
    TIMED_OUT: int
    CANCELED: int
    INITIATOR_LOST: int

class Notification:
    sender: str
    sender_incarnation: int
    message: bytes
    outcome: Outcome
    landed: list[int]

class RegionInfo:
    addr: int
    len: int
    kind: str
    device: int
    tag: str
    shared: bool
    read_only: bool

class PeerInfo:
    name: str
    incarnation: int
    host_id: str
    pid: int
    transport: str
    outbound: bool
    routes: list[str]
    moved: dict[str, int]
    nic_pairs: dict[str, int]
    staged_via: dict[str, int]

class MetricSample:
    labels: dict[str, str]
    value: float
    buckets: list[tuple[float, int]]
    sum: float

class Metric:
    name: str
    type: str
    help: str
    samples: list[MetricSample]

class Metrics:
    def __getitem__(self, name: str) -> Metric: ...
    def __contains__(self, name: str) -> bool: ...
    def __iter__(self) -> Iterator[str]: ...
    def __len__(self) -> int: ...
    def sum(self, name: str, **labels: str) -> float: ...
    def text(self) -> str: ...

class ClusterPeer:
    name: str
    address: str
    incarnation: int
    host_id: str
    tags: list[str]

class Region:
    addr: int
    len: int
    kind: str
    tag: str
    read_only: bool
    handle: int
    registered: bool
    def deregister(self) -> None: ...
    def __len__(self) -> int: ...

class Buffer:
    addr: int
    len: int
    kind: str
    tag: str
    read_only: bool
    handle: int
    freed: bool
    __cuda_array_interface__: dict[str, Any]
    def free(self) -> None: ...
    def __len__(self) -> int: ...
    def __buffer__(self, flags: int) -> memoryview: ...

class Request:
    landed: list[int]
    def wait(self, timeout: _Seconds = None) -> bool: ...
    def status(self) -> State: ...
    def done(self) -> bool: ...
    def cancel(self) -> None: ...
    def __await__(self) -> Any: ...

class PreparedList:
    peer: Optional[str]
    released: bool
    def release(self) -> None: ...
    def __len__(self) -> int: ...
    def __enter__(self) -> PreparedList: ...
    def __exit__(self, *args: Any) -> None: ...

class Engine:
    name: str
    closed: bool
    timeout: float
    def __init__(self, name: str, **options: Any) -> None: ...
    def close(self) -> None: ...
    def connect(self, peer: str, timeout: _Seconds = None) -> None: ...
    def _connect_async(self, peer: str, timeout: _Seconds = None) -> int: ...
    def _connect_poll(self, handle: int) -> bool: ...
    def disconnect(self, peer: str) -> None: ...
    def peer_info(self, peer: str) -> PeerInfo: ...
    def remote_regions(self, peer: str) -> list[RegionInfo]: ...
    def list_peers(self) -> list[ClusterPeer]: ...
    def metrics(self) -> Metrics: ...
    @property
    def metrics_address(self) -> str: ...
    def read(self, peer: str, descs: Optional[_Descs] = None, *, local: Optional[_Column] = None,
             remote: Optional[_Column] = None, length: Union[int, _Column, None] = None,
             timeout: _Seconds = None, notify: Optional[_Message] = None,
             checksum: Optional[bool] = None) -> None: ...
    def write(self, peer: str, descs: Optional[_Descs] = None, *, local: Optional[_Column] = None,
              remote: Optional[_Column] = None, length: Union[int, _Column, None] = None,
              timeout: _Seconds = None, notify: Optional[_Message] = None,
              checksum: Optional[bool] = None) -> None: ...
    def read_async(self, peer: str, descs: Optional[_Descs] = None, *, local: Optional[_Column] = None,
                   remote: Optional[_Column] = None, length: Union[int, _Column, None] = None,
                   timeout: _Seconds = None, notify: Optional[_Message] = None,
                   checksum: Optional[bool] = None) -> Request: ...
    def write_async(self, peer: str, descs: Optional[_Descs] = None, *, local: Optional[_Column] = None,
                    remote: Optional[_Column] = None, length: Union[int, _Column, None] = None,
                    timeout: _Seconds = None, notify: Optional[_Message] = None,
                    checksum: Optional[bool] = None) -> Request: ...
    def prepare_local(self, addr: _Column, length: Union[int, _Column]) -> PreparedList: ...
    def prepare_remote(self, peer: str, addr: _Column, length: Union[int, _Column]) -> PreparedList: ...
    def read_prepared(self, local: PreparedList, local_index: _Column, remote: PreparedList,
                      remote_index: _Column, *, timeout: _Seconds = None,
                      notify: Optional[_Message] = None,
                      checksum: Optional[bool] = None) -> None: ...
    def write_prepared(self, local: PreparedList, local_index: _Column, remote: PreparedList,
                       remote_index: _Column, *, timeout: _Seconds = None,
                       notify: Optional[_Message] = None,
                       checksum: Optional[bool] = None) -> None: ...
    def read_prepared_async(self, local: PreparedList, local_index: _Column, remote: PreparedList,
                            remote_index: _Column, *, timeout: _Seconds = None,
                            notify: Optional[_Message] = None,
                            checksum: Optional[bool] = None) -> Request: ...
    def write_prepared_async(self, local: PreparedList, local_index: _Column, remote: PreparedList,
                             remote_index: _Column, *, timeout: _Seconds = None,
                             notify: Optional[_Message] = None,
                             checksum: Optional[bool] = None) -> Request: ...
    def send_notify(self, peer: str, message: _Message, timeout: _Seconds = None) -> None: ...
    def get_notifies(self) -> list[Notification]: ...
    def wait_notifies(self, timeout: _Seconds = None) -> list[Notification]: ...

def option_names() -> str: ...

version: str

class TransportState:
    name: str
    available: bool
    why_not: str
    about: str

def transports(**options: object) -> list[TransportState]: ...
