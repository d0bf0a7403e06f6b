"""Producer: datasets in, templated and counted prompts out, each enqueued once."""
from genfleet.common import GenfleetError


class ProducerError(GenfleetError):
    """The root of the producer's errors: a dataset, a row, a run file or the options."""
