"""The simulated SGLang server: its protocol (wire, requests, server) and its capacity model."""
from genfleet.common import GenfleetError


class SimError(GenfleetError):
    """The root of the simulator's errors: a request it refuses, as SGLang would."""
