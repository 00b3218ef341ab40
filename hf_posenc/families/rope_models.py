"""Every model whose rotary embedding is a module built from its config (Llama and its kin:
the model-level `rotary_emb` of transformers v5). The method's rope_parameters go into a copy of
the config, and the family's own rotary class is rebuilt from it."""

from __future__ import annotations

import copy
import functools

import torch

from .. import _compat, attention
from ..attention import AttentionMethodConfig
from ..config import MethodConfig, RopeMethodConfig
from ..errors import InvalidParameterError, MethodNotApplicableError, UnsupportedModelError
from ..methods import rope
from ..plan import PatchPlan
from ..record import Original, PatchRecord, detach, recorded_family
from ..record_reader import method_config, read_record
from ..family import Family, register_family

# Causal-LM families of transformers 5.23 covered by tests/test_rope_families.py.
TESTED_MODEL_TYPES = (
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3_text", "phi",
    "gpt_neox", "phi3", "olmo", "olmo2", "stablelm", "granite", "cohere", "starcoder2", "smollm3", "deepseek_v3",
    "olmo3", "llama4_text",
)


class RopeModels(Family):
    name = "rope"
    mechanism = "rope"
    model_types = TESTED_MODEL_TYPES

    def rotary_modules(self, model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
        """(parent, attribute, module) for each rotary module driven by the model's text config."""
        text_config = model.config.get_text_config()
        return [
            (parent, name, child)
            for parent in model.modules()
            for name, child in parent.named_children()
            if isinstance(child, rope.LengthDependentRotary)
            or (_compat.is_rotary_module(child) and child.config is text_config)
        ]

    def matches(self, model: torch.nn.Module) -> bool:
        config = getattr(model, "config", None)
        if config is None:
            return False
        # a patch may have removed what the family looks for (ALiBi replaces the rotary module): its record says
        return (_compat.has_rope(config.get_text_config()) and bool(self.rotary_modules(model))) \
            or recorded_family(config) == self.name

    def describe(self, model: torch.nn.Module) -> dict:
        config = _homogeneous_text_config(model)
        layer_types = _compat.global_layer_types(config)
        params = _compat.get_rope_parameters(config, layer_types[0])
        return {
            "mechanism": "rope",
            "rope_type": params.get("rope_type", "default"),
            "rope_theta": params.get("rope_theta"),
            "rotary_dim": _compat.rotary_dim(config, layer_types[0]),
            "head_dim": _compat.head_dim(config),
            "factor": params.get("factor", 1.0),
            "original_max_position_embeddings": params.get("original_max_position_embeddings",
                                                           config.max_position_embeddings),
            "rope_layer_types": [t for t in _compat.rope_layer_types(config) if t is not None] or None,
            # models with several attention types (Gemma 3: sliding and full) keep one RoPE each
            "rope_by_layer_type": {
                lt: {"rope_type": p.get("rope_type", "default"), "rope_theta": p.get("rope_theta"),
                     "factor": p.get("factor", 1.0), "rotary_dim": _compat.rotary_dim(config, lt)}
                for lt in _compat.rope_layer_types(config) if lt is not None
                for p in [_compat.get_rope_parameters(config, lt)]
            } or None,
        }

    def check_length(self, model: torch.nn.Module, length: int) -> None:
        """`hp.check_length`: a RoPE model takes any length unless its patch bounds it (the method's
        `length_limit`: Self-Extend's longest grouped position)."""
        record = read_record(model.config)
        if record is not None:
            method_config(record).check_length(length, record.original.max_position_embeddings)

    def unpatched_config(self, config, record: PatchRecord) -> tuple:
        """The config of the model before the patch, from a loaded patched config (for
        `hp.from_pretrained`), and the saved tensors that do not fit that model (none here)."""
        config = copy.deepcopy(config)
        detach(config)
        text_config = config.get_text_config()
        text_config.rope_parameters = copy.deepcopy(record.original.rope_parameters)
        text_config.max_position_embeddings = record.original.max_position_embeddings
        _compat.drop_legacy_original(text_config)   # the patched longrope's, for transformers 4.x: not the model's
        return config, ()

    def plan(self, model: torch.nn.Module, method: MethodConfig) -> PatchPlan:
        if isinstance(method, AttentionMethodConfig):
            return self._plan_attention(model, method)
        assert isinstance(method, RopeMethodConfig)
        config = _homogeneous_text_config(model)
        private = self._private_rotary_modules(model)
        if private:
            raise UnsupportedModelError(
                f"this {config.model_type} model builds rotary modules from private copies of its config "
                f"({', '.join(private)}); a patch written into the model's config would not reach them, so hf_posenc "
                f"does not rescale this model"
            )
        layer_types = self._layer_types(config, method)
        natives = {lt: _compat.get_rope_parameters(config, lt) for lt in layer_types}
        original = self._original_context(config, natives, method)
        method = method.resolve(original)
        method.check_layer_types(config, layer_types)
        dims = {lt: _compat.rotary_dim(config, lt) for lt in layer_types}
        for lt in layer_types:
            method.check_rotary(dims[lt])

        new_root, config_map = _compat.copy_config_tree(model.config)
        new_config = config_map[id(config)]
        for lt in layer_types:
            _compat.set_rope_parameters(new_config, lt, rope.stock_parameters(method, natives[lt], original, dims[lt]))
        new_config.max_position_embeddings = method.max_position_embeddings
        _check_config_accepts(method, config, new_config)

        plan = PatchPlan(model=model, new_config=new_root, config_map=config_map, record=self._record(method, config))
        rebuilt: dict[int, torch.nn.Module] = {}
        for parent, name, old in self.rotary_modules(model):
            if id(old) not in rebuilt:
                rebuilt[id(old)] = self._rebuild(old, new_config, method, layer_types, natives, original)
            plan.swaps.append((parent, name, rebuilt[id(old)]))
        method.finish_plan(plan, model, new_config, layer_types)
        return plan

    def _plan_attention(self, model: torch.nn.Module, method: AttentionMethodConfig) -> PatchPlan:
        """A method that `removes_positions`: the rotary modules rotate by nothing (cos 1, sin 0) on the layer
        types it takes over (`rotated_layer_types`: all layers, or on a model with one RoPE per layer type the
        ones it names), and each attention module gets the method's child (a bias, a q / k transform, its own
        computation); the other layer types keep their RoPE. A method that keeps the rotation (XPos) only adds
        the child. The config records a rope_type stock transformers refuses, so a saved checkpoint never loads
        silently without the patch."""
        config = _homogeneous_text_config(model)
        method.check_rope_model(config)
        method = method.resolve(config.max_position_embeddings)
        method = method.for_model(config, _compat.rope_layer_types(config))
        targets = method.rotated_layer_types()
        new_root, config_map = _compat.copy_config_tree(model.config)
        new_config = config_map[id(config)]
        for lt in targets:  # the others (sliding layers) keep their RoPE
            native = _compat.get_rope_parameters(config, lt)
            _compat.set_rope_parameters(new_config, lt, rope.base_parameters(native) | {
                "rope_type": rope.CUSTOM_ROPE_TYPE_PREFIX + method.name})
        new_config.max_position_embeddings = method.max_position_embeddings
        _check_config_accepts(method, config, new_config)
        plan = PatchPlan(model=model, new_config=new_root, config_map=config_map, record=self._record(method, config))
        if method.removes_positions:
            if targets == [None]:
                dim = _compat.rotary_dim(config, None)
                complex_frequencies = config.model_type in _compat.COMPLEX_ROTARY_MODEL_TYPES
                plan.swaps += [(parent, name, rope.NoRotation(dim, complex_frequencies))
                               for parent, name, _ in self.rotary_modules(model)]
            else:
                dims = {lt: _compat.rotary_dim(config, lt) for lt in targets}
                plan.swaps += [(parent, name, rope.LayerTypeNoRotation(old, dims))
                               for parent, name, old in self.rotary_modules(model)]
        rotary = self.rotary_modules(model)[0][2]  # for methods that rotate q and k themselves (AttentionSite)
        attention.plan_attention(plan, model, method, new_config, rotary=rotary)
        return plan

    # -- helpers -------------------------------------------------------------------------------

    def _record(self, method: MethodConfig, config) -> PatchRecord:
        """What config.hf_posenc keeps of a patch: the method, its parameters, the settings it replaced."""
        return PatchRecord(
            family=self.name, mechanism=self.mechanism, method=method.name, params=method.to_dict(),
            original=Original(max_position_embeddings=config.max_position_embeddings,
                              rope_parameters=copy.deepcopy(config.rope_parameters)),
        )

    def _private_rotary_modules(self, model: torch.nn.Module) -> list[str]:
        """Rotary modules built from a config that is not part of the model's config tree (GraniteSWA
        keeps one per RoPE base, each on a deep copy of the config)."""
        known = {id(c) for c in _compat.sub_configs(model.config)}
        return [name for name, module in model.named_modules()
                if _compat.is_rotary_module(module) and id(module.config) not in known]

    def _layer_types(self, config, method: RopeMethodConfig) -> list[str | None]:
        available = _compat.rope_layer_types(config)
        if method.layer_types is None:
            return _compat.global_layer_types(config)
        if available == [None]:
            raise InvalidParameterError(
                f"layer_types={list(method.layer_types)} given, but this {config.model_type} model has one RoPE "
                f"for all layers; leave layer_types unset"
            )
        unknown = [t for t in method.layer_types if t not in available]
        if unknown:
            raise InvalidParameterError(f"layer_types {unknown} not in this model's RoPE layer types {available}")
        return list(method.layer_types)

    def _original_context(self, config, natives: dict, method: RopeMethodConfig) -> int:
        scaled = {lt: p["rope_type"] for lt, p in natives.items() if p.get("rope_type", "default") != "default"}
        if scaled and not method.replace_native:
            lt, rope_type = next(iter(scaled.items()))
            raise MethodNotApplicableError(
                f"this {config.model_type} checkpoint already ships rope_type={rope_type!r} scaling "
                f"({'layer type ' + repr(lt) + ', ' if lt else ''}max_position_embeddings="
                f"{config.max_position_embeddings}); hf_posenc rescales plain RoPE. Pass replace_native=True (a "
                f"recipe's config: posenc.replace_native: true, or --posenc.replace_native true) to replace that "
                f"scaling, starting from the plain rope_theta and the original pretraining context"
            )
        for params in natives.values():
            if "original_max_position_embeddings" in params:
                return int(params["original_max_position_embeddings"])
        # Phi-3 and kin keep the pretraining context at the top of the config, and transformers copies it
        # over the one in rope_parameters when it builds llama3 / yarn / longrope: use the same value
        top_level = getattr(config, "original_max_position_embeddings", None)
        if isinstance(top_level, int) and not isinstance(top_level, bool):
            return top_level
        return int(config.max_position_embeddings)

    def _rebuild(self, old: torch.nn.Module, new_config, method: RopeMethodConfig, layer_types, natives, original):
        device = next(old.buffers()).device
        dtype = next(b for name, b in old.named_buffers() if name.endswith("inv_freq")).dtype
        if not method.follows_length:  # static, or length-dependent inside transformers' own module (longrope)
            try:
                return _compat.build_rotary(type(old), new_config, device).to(dtype)
            except (ValueError, KeyError) as error:  # e.g. a rotary class that knows only "default"
                raise MethodNotApplicableError(
                    f"method {method.name!r} is refused by this {new_config.model_type} model's own rotary module "
                    f"{type(old).__name__}: {error}"
                ) from error
        # Frequencies that follow the input length: the family's module, built with plain RoPE on a
        # private config whose context is the original one, wrapped so each call sets them for L.
        inner_config = copy.deepcopy(new_config)
        inner_config.max_position_embeddings = original
        for lt in layer_types:
            _compat.set_rope_parameters(inner_config, lt, rope.base_parameters(natives[lt]))
        detach(inner_config)
        inner = _compat.build_rotary(type(old), inner_config, device).to(dtype)
        at = functools.partial(_parameters_at, method, natives, original)
        return rope.LengthDependentRotary(inner, layer_types, at)


def _homogeneous_text_config(model: torch.nn.Module):
    config = model.config.get_text_config()
    if getattr(config, "is_heterogeneous", False):
        raise UnsupportedModelError(
            f"this {config.model_type} model has a per-layer (heterogeneous) config whose head_dim and RoPE differ "
            f"by layer; hf_posenc does not rescale such models yet"
        )
    return config


def _check_config_accepts(method: MethodConfig, config, new_config) -> None:
    """Refuse a patch whose rope_parameters the family's own config check refuses (Phi-3 takes only its own rope
    types): transformers runs that check in save_pretrained, so the patched model could not be saved."""
    refused = _compat.rope_validation_error(new_config)
    if refused and not _compat.rope_validation_error(config):
        raise MethodNotApplicableError(
            f"method {method.name!r} cannot be written into this {config.model_type} model's config: its own RoPE "
            f"check refuses the result ({refused}), so the patched model could not be saved or loaded back"
        )


def _parameters_at(method, natives, original, seq_len, layer_type):
    return rope.parameters_at_length(method, natives[layer_type], original, seq_len)


register_family(RopeModels())
