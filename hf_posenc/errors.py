"""The errors hf_posenc raises. Each is a ValueError or TypeError subclass, so callers that
already catch those keep working, and each message names the parameter, the value and what is
allowed."""


class PosEncError(Exception):
    """Base class of every hf_posenc error."""


class UnsupportedModelError(PosEncError, ValueError):
    """No family adapter knows where this model keeps its positions."""


class MethodNotApplicableError(PosEncError, ValueError):
    """The method exists but does not apply to this model's mechanism."""


class InvalidParameterError(PosEncError, ValueError):
    """A parameter has the right type but a value that is not allowed."""


class UnknownNameError(InvalidParameterError, KeyError):
    """A name no registry table holds (hf_posenc.named.Registry.get): the known names listed, the closest one
    suggested. A KeyError too, so a lookup's callers that catch one keep working, but it reads as its message."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class UnknownMethodError(UnknownNameError):
    """A method name that is not registered."""


class RegistrationError(InvalidParameterError):
    """An entry a registry refuses (hf_posenc.named.Registry): not of the table's kind, no name of its own, or a
    name another entry holds."""


class ParameterTypeError(PosEncError, TypeError):
    """A parameter has the wrong type (a bool or a str where a number is expected, ...)."""


class AlreadyPatchedError(PosEncError, ValueError):
    """The model already carries an hf_posenc patch."""


class NotPatchedError(PosEncError, ValueError):
    """`unpatch` on a model that carries no hf_posenc patch."""


class SequenceTooLongError(PosEncError, ValueError):
    """An input is longer than the positions the model (or its patch) supports."""


class CheckpointMismatchError(PosEncError, ValueError):
    """A checkpoint's weights no longer match the hf_posenc patch its config records (edited after saving)."""


class CheckpointRecordError(CheckpointMismatchError):
    """A config's hf_posenc record is malformed (a key missing, an unknown family or method, a value of the
    wrong type) or disagrees with the config it sits in."""


class ConfigError(PosEncError, ValueError):
    """A recipe config that cannot work (an unknown key, a value of the wrong type or out of range, a path
    that is not there); raised before the model loads or anything is written."""


class InvalidInputError(PosEncError, ValueError):
    """An input that is not a method parameter cannot be used: token ids, a corpus, a corpus file."""


class ModelNotFoundError(PosEncError, FileNotFoundError):
    """A model path that does not exist, or a folder that holds no config.json."""


def one_line(err: BaseException) -> str:
    """An error's message on one line (a refusal is one `error: ...` line)."""
    return " ".join(str(err).split()) or type(err).__name__
