// Build wrapper for the AIBrix controller manager. One wrapper per AIBrix version: the version switch
// in stormtopo/devenv/components.py picks the directory (tools/aibrix/<version>).
module stormtopo.local/tools/aibrix

go 1.22.5

require github.com/vllm-project/aibrix v0.6.0

replace github.com/imdario/mergo v1.0.0 => dario.cat/mergo v0.3.16

// AIBrix v0.6.0 pins bytedance/sonic v1.14.2, which does not compile with Go 1.26 (undefined
// GoMapIterator); sonic v1.15.5 does. Raising it here changes no AIBrix code.
require github.com/bytedance/sonic v1.15.5
