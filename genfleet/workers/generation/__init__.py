"""Generating a prompt's completion in the server seam's terms (`workers/servers/`): the replies from
the stream to the record (`replies`), staged first caps (`first_cap`) and the loop guard
(`loop_guard`)."""
