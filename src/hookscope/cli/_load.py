"""The MODEL argument of every command and what goes with it: its options (``--weights``, ``--config``,
``--trust-pickle``, ``--seed``, ``--classes``) and one command's session (the options given to the
command's MODEL, warnings said once after it succeeded). The example input is ``_shapes``'.

MODEL is a spec of :func:`hookscope.load_model` (``tiny``, ``demo``, ``torchvision:NAME``,
``hf:CLASS_OR_TASK``, ``timm:NAME``, ``package.module:ATTR``, ``file.py:ATTR``, ``model.pt``); the
loading itself, and its security model, are :mod:`hookscope.loading`'s. Here its messages speak the
command line's options (``--weights``, ``MODEL``). A model left with random weights says so once on
stderr, when the command succeeds.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field

from torch import nn

from ..errors import HookscopeError
from ..loading import check_seed
from ..loading import class_names as model_class_names
from ..loading import load_model as load_spec
from ..loading.files import CODE_RUNS, safer
from ..loading.spec import DEMO_SPEC, HF_PREFIX, TIMM_PREFIX, TORCHVISION_PREFIX
from ..loading.voice import Terms, speaking

__all__ = ["DEMO_SPEC", "TRUST_FLAG", "add_class_arguments", "add_model_arguments", "check_class_names",
           "class_names", "load_model", "model_session", "note", "seed_arg", "trusting_pickles", "warn"]

TRUST_FLAG = "--trust-pickle"
_trust_pickle: ContextVar[bool] = ContextVar("hookscope_trust_pickle", default=False)


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    """The MODEL positional and the --input / --seed / --weights / --trust-pickle options of every model command.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_model_arguments(p)
        >>> args = p.parse_args(["torchvision:resnet18", "--weights", "DEFAULT"])
        >>> args.model, args.weights, args.trust_pickle
        ('torchvision:resnet18', 'DEFAULT', False)
    """
    p.add_argument("model", metavar="MODEL",
                   help=f"tiny | demo | torchvision:NAME | hf:CLASS_OR_TASK (with --config) | timm:NAME | "
                        "package.module:ATTR | file.py:ATTR | model.pt. "
                        f"{CODE_RUNS}: use only code you trust. A .pt or .pth file is read with "
                        "torch.load(weights_only=True), which runs no code; a whole pickled model "
                        f"(torch.save(model)) needs {TRUST_FLAG}. tiny and torchvision models without "
                        "--weights have random weights; demo is trained on hookscope's generated shapes. "
                        "hf:CLASS_OR_TASK is a transformers class (GPT2LMHeadModel, AutoModelForCausalLM) or a "
                        "task (causal-lm, masked-lm, seq2seq-lm, image-classification, sequence-classification); "
                        "timm:NAME is timm.create_model(NAME, pretrained=False)")
    p.add_argument("--input", metavar="SHAPE", default=None,
                   help="example input shape such as 1x3x224x224 (default: 1x3x32x32 for tiny, "
                        "1x3x64x64 for demo, 1x3x224x224 for torchvision models, the model's own for timm "
                        "and hf image models); for hf token models BATCHxLENGTH of random token ids "
                        "(default 1x16)")
    p.add_argument("--config", metavar="PATH", default=None,
                   help="for hf:CLASS_OR_TASK: a folder save_pretrained wrote (config.json, and weights "
                        "when present: random weights otherwise) or a config JSON file; local files only")
    p.add_argument("--input-ids", metavar="IDS", default=None,
                   help="token ids as the input, such as '15496 11 995'; several sequences of one length "
                        "separated by ';'")
    p.add_argument("--text", metavar="TEXT", default=None,
                   help="text as the input, tokenized by the tokenizer in the --config folder (hf models)")
    p.add_argument("--weights", metavar="FILE|NAME", default=None,
                   help="load these weights into MODEL: a state_dict file (.pt/.pth read with "
                        "torch.load(weights_only=True), or .safetensors), loaded strictly; or, for "
                        "torchvision:NAME, torchvision's weight name such as DEFAULT or IMAGENET1K_V1 "
                        "(downloaded once into torch.hub's cache)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed for weights and input (default 0)")
    p.epilog = f"Security: {CODE_RUNS}; a whole pickled model is loaded only with {TRUST_FLAG}."
    p.add_argument(TRUST_FLAG, action="store_true",
                   help="MODEL.pt is a whole model pickled with torch.save(model) by someone you trust: "
                        "load it with torch.load(weights_only=False), which runs any code the file "
                        "holds. Never use it on a file from an untrusted source; " + safer())


def seed_arg(text: str) -> int:
    """An argparse ``type`` for seeds: a whole number torch.manual_seed accepts."""
    try:
        seed = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
    try:
        return check_seed(seed)
    except HookscopeError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


@contextlib.contextmanager
def trusting_pickles(trust: bool) -> Iterator[None]:
    """Inside, :func:`load_model` loads whole pickled models (what ``--trust-pickle`` asks for)."""
    token = _trust_pickle.set(bool(trust))
    try:
        yield
    finally:
        _trust_pickle.reset(token)


@dataclass
class _Session:
    """One command's model options, and the warnings it says if it succeeds."""

    model: str | None
    weights: str | None
    command: str | None = None
    config: str | None = None
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


_session: ContextVar[_Session | None] = ContextVar("hookscope_session", default=None)
# Commands whose output (names, shapes, parameter counts) does not depend on the weights' values
_WEIGHTLESS = ("layers", "summary")


def _random_warning(spec: str) -> str:
    """What a command says of a MODEL left with random weights, and how to give it trained ones."""
    fix = ("pass --weights DEFAULT for torchvision's trained weights, or --weights FILE"
           if spec.startswith(TORCHVISION_PREFIX) else
           "give --config a folder that save_pretrained wrote with the weights, or --weights FILE"
           if spec.startswith(HF_PREFIX) else
           "pass --weights FILE (a state_dict)" if spec.startswith(TIMM_PREFIX) else
           f"pass --weights FILE, or use MODEL {DEMO_SPEC} (trained)")
    return f"{spec} has random weights (no --weights): its predictions and maps mean nothing; {fix}"


def _hear(session: _Session) -> Callable[[str, str], None]:
    """What loading says within a command, kept to be said once the command succeeded."""
    def hear(kind: str, text: str) -> None:
        if kind == "random":
            session.warnings.append(_random_warning(text))
        else:
            (session.notes if kind == "note" else session.warnings).append(text)
    return hear


def _say_now(kind: str, text: str) -> None:
    """Outside a command: a warning or a note on stderr at once; random weights are the caller's business."""
    if kind in ("warning", "note"):
        print(f"hookscope: {kind}: {text}", file=sys.stderr)


@contextlib.contextmanager
def model_session(args: argparse.Namespace) -> Iterator[None]:
    """One command's run: ``--trust-pickle`` and ``--weights`` apply to ``load_model(args.model)``, and
    a warning (random weights) goes to stderr once, after the command succeeded.

    A failed command says only its one-line error. Inside another session (a command that opens its
    own within the CLI's) it does nothing: the outer one holds the options and speaks.

    Example:
        >>> import contextlib, io
        >>> err = io.StringIO()
        >>> with contextlib.redirect_stderr(err), model_session(argparse.Namespace(model="tiny")):
        ...     _ = load_model("tiny"), load_model("tiny")
        >>> err.getvalue().count("warning: tiny has random weights")
        1
    """
    if _session.get() is not None:
        yield
        return
    command = getattr(args, "command", None)
    session = _Session(getattr(args, "model", None), getattr(args, "weights", None), command,
                       getattr(args, "config", None))
    token = _session.set(session)
    try:
        with trusting_pickles(bool(getattr(args, "trust_pickle", False))), \
                speaking(Terms(cli=True, command=command, weightless=command in _WEIGHTLESS), _hear(session)):
            yield
    finally:
        _session.reset(token)
    for line in dict.fromkeys(session.notes):  # what was done to the model, for every command
        print(f"hookscope: note: {line}", file=sys.stderr)
    if command in _WEIGHTLESS:
        return
    for line in dict.fromkeys(session.warnings):  # only reached when the command did not raise
        print(f"hookscope: warning: {line}", file=sys.stderr)


def _cli_words() -> contextlib.AbstractContextManager[None]:
    """The command line's words for loading's messages: the session's, or outside one said at once."""
    return contextlib.nullcontext() if _session.get() is not None else speaking(Terms(cli=True), _say_now)


def cli_words() -> contextlib.AbstractContextManager[None]:
    """Inside, the library's loading messages speak the command line's options (``--size``, not ``size=``).

    Example:
        >>> from hookscope.loading.voice import terms
        >>> with cli_words():
        ...     terms().cli
        True
    """
    return _cli_words()


def warn(line: str) -> None:
    """Say ``line`` as a ``hookscope: warning:`` on stderr once the command succeeded (at once outside one)."""
    session = _session.get()
    if session is None:
        print(f"hookscope: warning: {line}", file=sys.stderr)
    else:
        session.warnings.append(line)


def note(line: str) -> None:
    """Say ``line`` as a ``hookscope: note:`` on stderr once the command succeeded, for every command
    (at once outside one): what hookscope did to the model, such as resizing it to its weights."""
    session = _session.get()
    if session is None:
        print(f"hookscope: note: {line}", file=sys.stderr)
    else:
        session.notes.append(line)


def load_model(spec: str, seed: int = 0, *, trust_pickle: bool | None = None, weights: str | None = None,
               config: str | None = None) -> nn.Module:
    """:func:`hookscope.load_model` as a command calls it: messages in the command line's words, and
    inside :func:`model_session` the command's options for its MODEL.

    ``trust_pickle`` defaults to what the enclosing :func:`trusting_pickles` says (``--trust-pickle``),
    else False; ``weights`` and ``config``, when ``spec`` is the command's MODEL, to its ``--weights``
    and ``--config``. ``tiny``, torchvision, timm and hf models left with random weights add a warning
    to the session.

    Example:
        >>> model = load_model("tiny")
        >>> type(model).__name__, model.training
        ('TinyResNet', False)
    """
    trust = _trust_pickle.get() if trust_pickle is None else trust_pickle
    session = _session.get()
    if session is not None and spec == session.model:
        weights = session.weights if weights is None else weights
        config = session.config if config is None else config
    with _cli_words():
        return load_spec(spec, weights=weights, config=config, trust_pickle=trust, seed=seed)


# --- class names: --classes FILE, torchvision's weights, or the demo model's ------------------------
def add_class_arguments(p: argparse.ArgumentParser) -> None:
    """``--classes FILE``: the model's class names, for commands that show predictions.

    Example:
        >>> p = argparse.ArgumentParser()
        >>> add_class_arguments(p)
        >>> p.parse_args(["--classes", "names.txt"]).classes
        'names.txt'
    """
    p.add_argument("--classes", metavar="FILE", default=None,
                   help="the model's class names, one per line or a JSON list, in class order (default: "
                        "the categories of torchvision's --weights NAME, or the demo model's classes)")


def class_names(args: argparse.Namespace) -> list[str] | None:
    """The model's class names (:func:`hookscope.class_names`) from the command's MODEL, ``--weights``,
    ``--config`` and ``--classes``; None when nothing says.

    Example:
        >>> class_names(argparse.Namespace(model="demo", weights=None, classes=None))[:3]
        ['circle', 'square', 'triangle']
        >>> class_names(argparse.Namespace(model="torchvision:resnet18", weights="DEFAULT"))[:2]
        ['tench', 'goldfish']
    """
    with _cli_words():
        return model_class_names(args.model, weights=getattr(args, "weights", None),
                                 config=getattr(args, "config", None), classes=getattr(args, "classes", None))


def check_class_names(names: Sequence[str], outputs: int, args: argparse.Namespace) -> None:
    """One line when the class names are not one per model output.

    Example:
        >>> check_class_names(["a", "b"], 3, argparse.Namespace(model="m.py:Net", classes="names.txt"))
        Traceback (most recent call last):
        ...
        hookscope.errors.HookscopeError: --classes names.txt gives 2 class names but the model has 3 outputs; give one name per output, in class order
    """
    if len(names) == outputs:
        return
    source = (f"--classes {args.classes}" if getattr(args, "classes", None) is not None
              else f"--weights {args.weights}" if getattr(args, "weights", None) is not None else f"MODEL {args.model}")
    raise HookscopeError(f"{source} gives {len(names)} class names but the model has {outputs} outputs; "
                         "give one name per output, in class order")
