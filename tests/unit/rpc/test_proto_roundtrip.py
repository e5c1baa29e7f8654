"""Every message of the sluice.v1 contracts survives serialize -> parse with
every field set (generated from the descriptors, so a new field or message
is covered without touching this test)."""

import pytest
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message

from sluice.v1 import common_pb2, replica_pb2, router_pb2, scheduler_pb2

MODULES = (common_pb2, router_pb2, scheduler_pb2, replica_pb2)


def _all_messages() -> list[Descriptor]:
    found = []

    def walk(descriptor: Descriptor) -> None:
        if not descriptor.GetOptions().map_entry:  # a map field's entry type is no message of its own
            found.append(descriptor)
        for nested in descriptor.nested_types:
            walk(nested)

    for module in MODULES:
        for descriptor in module.DESCRIPTOR.message_types_by_name.values():
            walk(descriptor)
    return found


SCALARS = {
    FieldDescriptor.TYPE_STRING: "héllo ✓",
    FieldDescriptor.TYPE_BYTES: b"\x00\xff",
    FieldDescriptor.TYPE_BOOL: True,
    FieldDescriptor.TYPE_DOUBLE: 1.5,
    FieldDescriptor.TYPE_FLOAT: 0.25,
    FieldDescriptor.TYPE_INT32: -7,
    FieldDescriptor.TYPE_INT64: -(1 << 40),
    FieldDescriptor.TYPE_UINT32: (1 << 32) - 1,
    FieldDescriptor.TYPE_UINT64: (1 << 64) - 1,
}


def _value(field: FieldDescriptor):
    if field.type == FieldDescriptor.TYPE_ENUM:
        return field.enum_type.values[-1].number
    return SCALARS[field.type]


def _fill(message: Message, depth: int = 0) -> Message:
    seen_oneofs: set[str] = set()
    for field in message.DESCRIPTOR.fields:
        oneof = field.containing_oneof
        # Only one member of a real oneof can be set (proto3 `optional` is a
        # synthetic one-field oneof and is always set here).
        if oneof is not None and len(oneof.fields) > 1:
            if oneof.name in seen_oneofs:
                continue
            seen_oneofs.add(oneof.name)
        repeated = field.is_repeated
        if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type.GetOptions().map_entry:
            key_field, value_field = field.message_type.fields_by_name["key"], field.message_type.fields_by_name["value"]
            getattr(message, field.name)[_value(key_field)] = _value(value_field)  # scalar maps only
        elif field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth > 3:
                continue
            if repeated:
                _fill(getattr(message, field.name).add(), depth + 1)
                _fill(getattr(message, field.name).add(), depth + 1)
            else:
                _fill(getattr(message, field.name), depth + 1)
        elif repeated:
            getattr(message, field.name).extend([_value(field), _value(field)])
        else:
            setattr(message, field.name, _value(field))
    return message


@pytest.mark.parametrize("descriptor", _all_messages(), ids=lambda d: d.full_name)
def test_every_message_round_trips(descriptor: Descriptor):
    module = next(m for m in MODULES if m.DESCRIPTOR == descriptor.file)
    cls = getattr(module, descriptor.name)
    original = _fill(cls())
    wire = original.SerializeToString()
    parsed = cls.FromString(wire)
    assert parsed == original
    assert parsed.SerializeToString(deterministic=True) == original.SerializeToString(deterministic=True)
    if descriptor.fields:
        assert wire, "a filled message must not serialize to nothing"


def test_each_oneof_member_round_trips():
    events = [
        router_pb2.GenerateEvent(admitted=router_pb2.Admitted(model_version="v1", prompt_tokens=3)),
        router_pb2.GenerateEvent(delta=router_pb2.Delta(text="hi", token_ids=[1, 2])),
        router_pb2.GenerateEvent(finished=router_pb2.Finished(finish_reason=common_pb2.FINISH_REASON_LENGTH)),
        router_pb2.GenerateEvent(error=router_pb2.Error(code="x", message="y")),
    ]
    for event in events:
        parsed = router_pb2.GenerateEvent.FromString(event.SerializeToString())
        assert parsed.WhichOneof("event") == event.WhichOneof("event")
        assert parsed == event
    chat = router_pb2.GenerateRequest(chat=router_pb2.ChatMessages(messages=[router_pb2.ChatMessage(role="user")]))
    text = router_pb2.GenerateRequest(prompt_text="p")
    assert router_pb2.GenerateRequest.FromString(chat.SerializeToString()).WhichOneof("input") == "chat"
    assert router_pb2.GenerateRequest.FromString(text.SerializeToString()).WhichOneof("input") == "prompt_text"
    placement = scheduler_pb2.Placement(request_id="r", reject=scheduler_pb2.Reject(reason="over_capacity"))
    assert scheduler_pb2.Placement.FromString(placement.SerializeToString()).WhichOneof("outcome") == "reject"


def test_optional_seed_presence_survives_the_wire():
    unset = common_pb2.SamplingParams()
    zero = common_pb2.SamplingParams(seed=0)
    assert not common_pb2.SamplingParams.FromString(unset.SerializeToString()).HasField("seed")
    assert common_pb2.SamplingParams.FromString(zero.SerializeToString()).HasField("seed")
