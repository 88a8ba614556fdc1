"""Tool calling: the calls in a model's answer, whole or as it streams.

`parser` is the machinery every format shares (content streamed as it comes, each call block held until it
is complete, then parsed or, malformed, given back as content); `hermes`, `llama3_json`, `mistral` and
`pythonic` are vLLM's parsers of the same names, `parsers` the registry and each model family's default.
`json_stream` streams the calls of ``tool_choice: "required"`` (a JSON array the grammar keeps well formed),
and `choice` turns a request's tools and ``tool_choice`` into the grammar that constrains its arguments.
"""
