"""The vLLM policy: Ray Serve LLM (``LLMConfig`` + ``build_openai_app``) from rayrollout YAML.

Its policy kind (deploy, weight updates over the control endpoints) is ``kind.VLLM``.
"""

from rayrollout.deployments.vllm.app import VllmDeploymentConfig, build_vllm_app, load_vllm_config

__all__ = ["VllmDeploymentConfig", "build_vllm_app", "load_vllm_config"]
