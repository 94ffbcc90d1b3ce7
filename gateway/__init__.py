"""The HTTP face of boundserve (aiohttp on uvloop). Never imports torch or transformers.

Request path: app (routes, middleware, the one handler skeleton) -> api/ (body, decoding, rules, typed
requests and answers) -> scoring / generation (tokenizer, admission, batcher) -> worker_pool / worker_link
(ZeroMQ, the protocol of shared/protocol/) -> answer. errors holds the one table of rejection reasons.
"""
