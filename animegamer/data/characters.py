"""The character registry: the characters of your anime, by name, with reference images.

A JSON object mapping each name to its reference images (paths relative to the JSON file, or absolute)::

    {"Qiqi": ["refs/qiqi_front.png", "refs/qiqi_side.png"], "Sora": ["refs/sora.png"]}

The captioner shows the references to the vision-language model to tell which characters appear in a clip, and
the names are what a player writes after ``Character:`` in a game instruction. Names must be usable inside the
instruction and tag formats (no ``;``, ``<``, ``>`` or line breaks), unique regardless of case, and every image
must exist and decode.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from animegamer.states import Instruction, TagError

_FORBIDDEN = (";", "<", ">", "\n", "\r", "\t")


class RegistryError(ValueError):
    """The registry file is invalid; the message names the file and the character."""


@dataclass(frozen=True)
class CharacterRegistry:
    path: Path | None
    references: dict[str, tuple[Path, ...]]  # name -> reference image files, in file order

    @property
    def names(self) -> list[str]:
        return list(self.references)

    def canonical(self, name: str) -> str | None:
        """The registered spelling of ``name`` (case and surrounding space ignored), or None."""
        key = name.strip().casefold()
        return next((n for n in self.references if n.casefold() == key), None)

    def load_images(self, name: str, max_side: int = 0) -> list[np.ndarray]:
        """The reference images of one character as RGB uint8 arrays, longer side at most ``max_side``."""
        return [load_image(p, max_side) for p in self.references[name]]

    def check_instruction(self, instruction: Instruction) -> Instruction:
        """A structured instruction with its character in the registry (spelled as registered); free text passes."""
        if not instruction.structured:
            return instruction
        name = self.canonical(instruction.character)
        if name is None:
            raise TagError(f"unknown character {instruction.character!r}; known: {self.names}", field="character")
        return Instruction(character=name, motion=instruction.motion, background=instruction.background)


def load_image(path: str | Path, max_side: int = 0) -> np.ndarray:
    """An image file as RGB uint8 (H, W, 3), shrunk (aspect kept) so its longer side is at most ``max_side``."""
    from PIL import Image

    with Image.open(path) as image:
        image = image.convert("RGB")
        if max_side and max(image.size) > max_side:
            image.thumbnail((max_side, max_side), Image.Resampling.LANCZOS)
        return np.asarray(image)


def validate_name(name: object, where: str) -> str:
    if not isinstance(name, str) or not name.strip():
        raise RegistryError(f"{where}: character names must be non-empty strings (got {name!r})")
    if name != name.strip() or any(c in name for c in _FORBIDDEN):
        raise RegistryError(f"{where}: character name {name!r} has surrounding spaces or one of ; < > or a line break")
    return name


def read_character_registry(path: str | Path, check_images: bool = True) -> CharacterRegistry:
    """Read and validate a registry JSON; every problem raises :class:`RegistryError` naming file and character."""
    path = Path(path)
    if not path.is_file():
        raise RegistryError(f"character registry not found: {path}")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RegistryError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or not data:
        raise RegistryError(f"{path}: expected a non-empty JSON object mapping names to lists of image paths")
    references: dict[str, tuple[Path, ...]] = {}
    seen: dict[str, str] = {}
    for name, images in data.items():
        validate_name(name, str(path))
        where = f"{path}: character {name!r}"
        if name.casefold() in seen:
            raise RegistryError(f"{where}: same name as {seen[name.casefold()]!r} (names are case-insensitive)")
        seen[name.casefold()] = name
        if isinstance(images, str):
            images = [images]
        if not isinstance(images, list) or not images or not all(isinstance(p, str) and p for p in images):
            raise RegistryError(f"{where}: expected a non-empty list of image paths")
        files = tuple(p if p.is_absolute() else path.parent / p for p in map(Path, images))
        if check_images:
            for file in files:
                _check_image(file, where)
        references[name] = files
    return CharacterRegistry(path=path, references=references)


def _check_image(file: Path, where: str) -> None:
    from PIL import Image, UnidentifiedImageError

    if not file.is_file():
        raise RegistryError(f"{where}: reference image not found: {file}")
    try:
        with Image.open(file) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise RegistryError(f"{where}: reference image cannot be decoded: {file} ({exc})") from None
