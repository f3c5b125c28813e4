"""Types of batchcast._status, the status queries without torch
(csrc/batchcast/python/status_module.cpp). Errors of the core arrive as
RuntimeError (ValueError for an invalid argument), not as batchcast.Error:
this module does not load batchcast._C."""

from typing import TypedDict

PROTOCOL_VERSION: int

class _ProducerListing(TypedDict):
    name: str
    endpoint: str
    alive: bool
    status: str  # the producer's status as JSON text; "" if it did not answer
    note: str

def runtime_dir(override_dir: str = "") -> str: ...
def list_producers(
    runtime_dir: str = "", name: str = "", timeout: float = 1.0, clean: bool = True
) -> list[_ProducerListing]: ...
