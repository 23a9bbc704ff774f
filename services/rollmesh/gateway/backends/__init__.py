"""Model backends: the `ModelBackend` ABC and its value types (base), the fake, the OpenAI-URL
backend (openai), and the one place a backend name becomes an instance (factory). Ray Serve + vLLM
lives in `rollmesh.serving`. Heavy backends are imported only when `create_backend` needs them."""
