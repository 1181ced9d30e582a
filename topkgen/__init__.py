"""topkgen: GPU top-k kernel manifests and AOT bundles from one YAML policy."""

__version__ = "0.1.0"
