from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MemberState(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MEMBER_STATE_UNSPECIFIED: _ClassVar[MemberState]
    MEMBER_STATE_ALIVE: _ClassVar[MemberState]
    MEMBER_STATE_SUSPECT: _ClassVar[MemberState]
    MEMBER_STATE_DEAD: _ClassVar[MemberState]
MEMBER_STATE_UNSPECIFIED: MemberState
MEMBER_STATE_ALIVE: MemberState
MEMBER_STATE_SUSPECT: MemberState
MEMBER_STATE_DEAD: MemberState

class Envelope(_message.Message):
    __slots__ = ("frame", "mac")
    FRAME_FIELD_NUMBER: _ClassVar[int]
    MAC_FIELD_NUMBER: _ClassVar[int]
    frame: bytes
    mac: bytes
    def __init__(self, frame: _Optional[bytes] = ..., mac: _Optional[bytes] = ...) -> None: ...

class Frame(_message.Message):
    __slots__ = ("version", "sender", "sent_unix_ms", "nonce", "reply_to", "recipient_id", "recipient_address", "ping", "indirect_ping", "rumours", "updates", "push_pull", "snapshot_request", "ack", "indirect_ack", "rumours_reply", "push_pull_reply", "snapshot_chunk", "nack")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    SENDER_FIELD_NUMBER: _ClassVar[int]
    SENT_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    NONCE_FIELD_NUMBER: _ClassVar[int]
    REPLY_TO_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECIPIENT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PING_FIELD_NUMBER: _ClassVar[int]
    INDIRECT_PING_FIELD_NUMBER: _ClassVar[int]
    RUMOURS_FIELD_NUMBER: _ClassVar[int]
    UPDATES_FIELD_NUMBER: _ClassVar[int]
    PUSH_PULL_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_REQUEST_FIELD_NUMBER: _ClassVar[int]
    ACK_FIELD_NUMBER: _ClassVar[int]
    INDIRECT_ACK_FIELD_NUMBER: _ClassVar[int]
    RUMOURS_REPLY_FIELD_NUMBER: _ClassVar[int]
    PUSH_PULL_REPLY_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_CHUNK_FIELD_NUMBER: _ClassVar[int]
    NACK_FIELD_NUMBER: _ClassVar[int]
    version: int
    sender: str
    sent_unix_ms: int
    nonce: int
    reply_to: int
    recipient_id: str
    recipient_address: str
    ping: Ping
    indirect_ping: IndirectPing
    rumours: Rumours
    updates: Updates
    push_pull: PushPull
    snapshot_request: SnapshotRequest
    ack: Ack
    indirect_ack: IndirectAck
    rumours_reply: RumoursReply
    push_pull_reply: PushPullReply
    snapshot_chunk: SnapshotChunk
    nack: Nack
    def __init__(self, version: _Optional[int] = ..., sender: _Optional[str] = ..., sent_unix_ms: _Optional[int] = ..., nonce: _Optional[int] = ..., reply_to: _Optional[int] = ..., recipient_id: _Optional[str] = ..., recipient_address: _Optional[str] = ..., ping: _Optional[_Union[Ping, _Mapping]] = ..., indirect_ping: _Optional[_Union[IndirectPing, _Mapping]] = ..., rumours: _Optional[_Union[Rumours, _Mapping]] = ..., updates: _Optional[_Union[Updates, _Mapping]] = ..., push_pull: _Optional[_Union[PushPull, _Mapping]] = ..., snapshot_request: _Optional[_Union[SnapshotRequest, _Mapping]] = ..., ack: _Optional[_Union[Ack, _Mapping]] = ..., indirect_ack: _Optional[_Union[IndirectAck, _Mapping]] = ..., rumours_reply: _Optional[_Union[RumoursReply, _Mapping]] = ..., push_pull_reply: _Optional[_Union[PushPullReply, _Mapping]] = ..., snapshot_chunk: _Optional[_Union[SnapshotChunk, _Mapping]] = ..., nack: _Optional[_Union[Nack, _Mapping]] = ...) -> None: ...

class Member(_message.Message):
    __slots__ = ("id", "address", "incarnation", "state")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    incarnation: int
    state: MemberState
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., incarnation: _Optional[int] = ..., state: _Optional[_Union[MemberState, str]] = ...) -> None: ...

class Ping(_message.Message):
    __slots__ = ("target_id", "members")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, target_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("members",)
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class IndirectPing(_message.Message):
    __slots__ = ("target_id", "target_address")
    TARGET_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    target_id: str
    target_address: str
    def __init__(self, target_id: _Optional[str] = ..., target_address: _Optional[str] = ...) -> None: ...

class IndirectAck(_message.Message):
    __slots__ = ("reached",)
    REACHED_FIELD_NUMBER: _ClassVar[int]
    reached: bool
    def __init__(self, reached: _Optional[bool] = ...) -> None: ...

class Delta(_message.Message):
    __slots__ = ("origin", "seq", "created_unix_ms", "engine", "added", "removed", "cleared")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    ADDED_FIELD_NUMBER: _ClassVar[int]
    REMOVED_FIELD_NUMBER: _ClassVar[int]
    CLEARED_FIELD_NUMBER: _ClassVar[int]
    origin: str
    seq: int
    created_unix_ms: int
    engine: str
    added: _containers.RepeatedScalarFieldContainer[int]
    removed: _containers.RepeatedScalarFieldContainer[int]
    cleared: bool
    def __init__(self, origin: _Optional[str] = ..., seq: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., engine: _Optional[str] = ..., added: _Optional[_Iterable[int]] = ..., removed: _Optional[_Iterable[int]] = ..., cleared: _Optional[bool] = ...) -> None: ...

class DeltaIds(_message.Message):
    __slots__ = ("origin", "seqs")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SEQS_FIELD_NUMBER: _ClassVar[int]
    origin: str
    seqs: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, origin: _Optional[str] = ..., seqs: _Optional[_Iterable[int]] = ...) -> None: ...

class EngineLoad(_message.Message):
    __slots__ = ("engine", "requests", "tokens")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    requests: int
    tokens: int
    def __init__(self, engine: _Optional[str] = ..., requests: _Optional[int] = ..., tokens: _Optional[int] = ...) -> None: ...

class PrefixHeat(_message.Message):
    __slots__ = ("prefix", "requests")
    PREFIX_FIELD_NUMBER: _ClassVar[int]
    REQUESTS_FIELD_NUMBER: _ClassVar[int]
    prefix: int
    requests: int
    def __init__(self, prefix: _Optional[int] = ..., requests: _Optional[int] = ...) -> None: ...

class LoadReport(_message.Message):
    __slots__ = ("origin", "version", "created_unix_ms", "engines", "prefixes")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    PREFIXES_FIELD_NUMBER: _ClassVar[int]
    origin: str
    version: int
    created_unix_ms: int
    engines: _containers.RepeatedCompositeFieldContainer[EngineLoad]
    prefixes: _containers.RepeatedCompositeFieldContainer[PrefixHeat]
    def __init__(self, origin: _Optional[str] = ..., version: _Optional[int] = ..., created_unix_ms: _Optional[int] = ..., engines: _Optional[_Iterable[_Union[EngineLoad, _Mapping]]] = ..., prefixes: _Optional[_Iterable[_Union[PrefixHeat, _Mapping]]] = ...) -> None: ...

class Rumours(_message.Message):
    __slots__ = ("members", "loads", "offers")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    OFFERS_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    loads: _containers.RepeatedCompositeFieldContainer[LoadReport]
    offers: _containers.RepeatedCompositeFieldContainer[DeltaIds]
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[LoadReport, _Mapping]]] = ..., offers: _Optional[_Iterable[_Union[DeltaIds, _Mapping]]] = ...) -> None: ...

class RumoursReply(_message.Message):
    __slots__ = ("want", "members")
    WANT_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    want: _containers.RepeatedCompositeFieldContainer[DeltaIds]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    def __init__(self, want: _Optional[_Iterable[_Union[DeltaIds, _Mapping]]] = ..., members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ...) -> None: ...

class Updates(_message.Message):
    __slots__ = ("deltas", "loads")
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[Delta]
    loads: _containers.RepeatedCompositeFieldContainer[LoadReport]
    def __init__(self, deltas: _Optional[_Iterable[_Union[Delta, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[LoadReport, _Mapping]]] = ...) -> None: ...

class OriginSeq(_message.Message):
    __slots__ = ("origin", "seq")
    ORIGIN_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    origin: str
    seq: int
    def __init__(self, origin: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class Digest(_message.Message):
    __slots__ = ("deltas", "loads")
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    deltas: _containers.RepeatedCompositeFieldContainer[OriginSeq]
    loads: _containers.RepeatedCompositeFieldContainer[OriginSeq]
    def __init__(self, deltas: _Optional[_Iterable[_Union[OriginSeq, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[OriginSeq, _Mapping]]] = ...) -> None: ...

class PushPull(_message.Message):
    __slots__ = ("members", "digest")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    digest: Digest
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., digest: _Optional[_Union[Digest, _Mapping]] = ...) -> None: ...

class PushPullReply(_message.Message):
    __slots__ = ("members", "digest", "deltas", "loads", "snapshot_advised")
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    DELTAS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_ADVISED_FIELD_NUMBER: _ClassVar[int]
    members: _containers.RepeatedCompositeFieldContainer[Member]
    digest: Digest
    deltas: _containers.RepeatedCompositeFieldContainer[Delta]
    loads: _containers.RepeatedCompositeFieldContainer[LoadReport]
    snapshot_advised: bool
    def __init__(self, members: _Optional[_Iterable[_Union[Member, _Mapping]]] = ..., digest: _Optional[_Union[Digest, _Mapping]] = ..., deltas: _Optional[_Iterable[_Union[Delta, _Mapping]]] = ..., loads: _Optional[_Iterable[_Union[LoadReport, _Mapping]]] = ..., snapshot_advised: _Optional[bool] = ...) -> None: ...

class SnapshotRequest(_message.Message):
    __slots__ = ("snapshot_id", "chunk")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    chunk: int
    def __init__(self, snapshot_id: _Optional[int] = ..., chunk: _Optional[int] = ...) -> None: ...

class EngineBlocks(_message.Message):
    __slots__ = ("engine", "keys")
    ENGINE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    engine: str
    keys: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, engine: _Optional[str] = ..., keys: _Optional[_Iterable[int]] = ...) -> None: ...

class SnapshotChunk(_message.Message):
    __slots__ = ("snapshot_id", "chunk", "chunks", "covers", "loads", "engines")
    SNAPSHOT_ID_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    COVERS_FIELD_NUMBER: _ClassVar[int]
    LOADS_FIELD_NUMBER: _ClassVar[int]
    ENGINES_FIELD_NUMBER: _ClassVar[int]
    snapshot_id: int
    chunk: int
    chunks: int
    covers: Digest
    loads: _containers.RepeatedCompositeFieldContainer[LoadReport]
    engines: _containers.RepeatedCompositeFieldContainer[EngineBlocks]
    def __init__(self, snapshot_id: _Optional[int] = ..., chunk: _Optional[int] = ..., chunks: _Optional[int] = ..., covers: _Optional[_Union[Digest, _Mapping]] = ..., loads: _Optional[_Iterable[_Union[LoadReport, _Mapping]]] = ..., engines: _Optional[_Iterable[_Union[EngineBlocks, _Mapping]]] = ...) -> None: ...

class Nack(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...
