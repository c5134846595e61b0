"""The vLLM policy: Ray Serve LLM (``LLMConfig`` + ``build_openai_app``) from rayrollout YAML."""

from rayrollout.deployments.vllm.app import VllmDeploymentConfig, build_vllm_app, load_vllm_config

__all__ = ["VllmDeploymentConfig", "build_vllm_app", "load_vllm_config"]
