# kernelgw: IRkernel as the gateway runs it (start-kernel runs this file with
# the connection file after --args).
local({
    # After a failed or interrupted cell, IRkernel answers every request
    # already queued behind it with "aborted" (whatever the request's
    # stop_on_error says), and sends no status for them. The only request that
    # can be queued there is the gateway's end probe, sent right after a failed
    # cell's reply: aborted, its idle never came and the failed cell ended
    # 1.5 s late ("no idle status"). The gateway keeps its own queue and stops
    # a client's later cells on error itself, so the kernel aborts nothing.
    kernel_methods <- IRkernel:::Kernel$def@refMethods
    keep_queued <- kernel_methods$abort_queued_messages
    keep_queued@.Data <- function() invisible(NULL)
    assign("abort_queued_messages", keep_queued, envir = kernel_methods)
})
IRkernel::main()
