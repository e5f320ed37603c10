"""Acting on the platforms through their APIs: what gpupool changes on a node, audited and race-safe."""
