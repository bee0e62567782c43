# kernelgw's Ruby driver: one Ruby process per kernel that evaluates cells in
# one persistent binding (TOPLEVEL_BINDING), so local variables, methods,
# classes and required libraries persist between cells, as in irb.
#
#   ruby kernelgw_driver.rb CODE_FD RECORD_FD
#
# The kernel (kernelgw_kernel.lang_ruby) writes one JSON line per cell to
# CODE_FD: {"code": "...", "cell": 3, "silent": false}. The driver writes JSON
# lines to RECORD_FD: {"type": "ready", ...} once at start, {"type":
# "display", "data": {...}} for IRuby.display, and one {"type": "done",
# "status": "ok", "result": {...}} or {"type": "done", "status": "error",
# "ename", "evalue", "traceback"} per cell. The cell's own stdout and stderr are
# the process's (pipes the kernel streams as they come); both are synced, so
# everything a cell printed is in them before its "done" record is written.
#
# SIGINT (the kernel sends it to the process group) raises Interrupt in the
# main thread (Ruby's default handler) while a cell runs; between cells it is
# ignored. The driver's own
# work runs with interrupts deferred, so an interrupt can only ever end user
# code, never the driver.
#
# This file defines no local variables at its top level: cells share
# TOPLEVEL_BINDING, so any would be visible to them.

require 'json'

module IRuby
  # What a display shows: a MIME bundle (IRuby's names, so notebooks written
  # for IRuby display the same here).
  class Rich
    attr_reader :data

    def initialize(data)
      @data = data
    end

    def inspect
      @data['text/plain'] || "#<IRuby::Rich #{@data.keys.join(', ')}>"
    end

    def to_s
      inspect
    end
  end

  module_function

  # Show obj now (its MIME bundle, or as mime when given); returns nil.
  def display(obj, mime: nil, metadata: {})
    KernelgwDriver.display(KernelgwDriver.bundle(obj, mime), metadata)
    nil
  end

  def html(text)
    Rich.new('text/html' => text.to_s, 'text/plain' => text.to_s)
  end

  def svg(text)
    Rich.new('image/svg+xml' => text.to_s, 'text/plain' => '#<SVG image>')
  end

  def markdown(text)
    Rich.new('text/markdown' => text.to_s, 'text/plain' => text.to_s)
  end

  # An HTML table of rows: an array of arrays (with header: the column names),
  # an array of hashes (the keys are the columns) or a hash of columns.
  def table(rows, header: nil, maxrows: 1000)
    rows, header = KernelgwDriver.table_rows(rows, header)
    shown = rows.first(maxrows)
    esc = ->(v) { KernelgwDriver.escape_html(v) }
    html = +'<table>'
    html << '<thead><tr>' << header.map { |h| "<th>#{esc.(h)}</th>" }.join << '</tr></thead>' if header
    html << '<tbody>'
    shown.each { |row| html << '<tr>' << row.map { |v| "<td>#{esc.(v)}</td>" }.join << '</tr>' }
    html << '</tbody></table>'
    html << "<p>#{rows.size - shown.size} more rows</p>" if rows.size > shown.size
    lines = []
    lines << header.map(&:to_s).join("\t") if header
    shown.each { |row| lines << row.map(&:to_s).join("\t") }
    Rich.new('text/html' => html, 'text/plain' => lines.join("\n"))
  end
end

module KernelgwDriver
  MAX_PLAIN = 1_000_000

  class << self
    attr_reader :records

    def start(code_fd, record_fd)
      @code = IO.new(code_fd, 'r', autoclose: true)
      @records = IO.new(record_fd, 'w', autoclose: true)
      [@code, @records].each { |io| io.close_on_exec = true }
      @records.sync = true
      $stdout.sync = true
      $stderr.sync = true
      send_record(type: 'ready', version: RUBY_VERSION, description: RUBY_DESCRIPTION)
      Thread.handle_interrupt(Object => :never) { serve }
    end

    def serve
      loop do
        line = begin
          # a pending interrupt (one that came as a cell ended) ends up here
          Thread.handle_interrupt(Object => :on_blocking) { @code.gets }
        rescue Interrupt
          next
        end
        break if line.nil?

        begin
          request = JSON.parse(line)
        rescue JSON::ParserError => e
          send_record(type: 'done', status: 'error', ename: 'KernelError', evalue: e.message, traceback: [])
          next
        end
        send_record(evaluate(request))
      end
    end

    def evaluate(request)
      code = request['code'].to_s
      file = "(cell #{request['cell']})"
      result = nil
      Thread.handle_interrupt(Object => :immediate) do
        value = TOPLEVEL_BINDING.eval(code, file, 1)
        result = bundle(value, nil) unless value.nil? || request['silent'] || code.rstrip.end_with?(';')
      end
      flush
      { type: 'done', status: 'ok', result: result }
    rescue Exception => e # rubocop:disable Lint/RescueException: a cell's every failure is its error
      flush
      error_record(e, file)
    end

    def error_record(error, file)
      message = error.message.to_s
      message = error.class.name if message.empty?
      trace = backtrace(error, file)
      first = trace.first || file
      lines = message.lines.map(&:chomp)
      head = "#{first}: #{lines.first} (#{error.class.name})"
      traceback = if error.is_a?(SyntaxError) || error.is_a?(SystemExit)
                    ["#{error.class.name}: #{message}"]
                  else
                    [head, *lines.drop(1), *trace.drop(1).map { |l| "\tfrom #{l}" }]
                  end
      { type: 'done', status: 'error', ename: error.class.name, evalue: message, traceback: traceback.first(200) }
    end

    # the cell's frames and what they called, without the driver's own
    def backtrace(error, _file)
      (error.backtrace || []).reject { |l| l.start_with?(__FILE__) || l.include?("in `eval'") }
    end

    def flush
      $stdout.flush
      $stderr.flush
    rescue StandardError
      nil
    end

    def bundle(obj, mime)
      return obj.data.dup if obj.is_a?(IRuby::Rich) && mime.nil?

      data = {}
      if mime
        data[mime] = obj.is_a?(IRuby::Rich) ? (obj.data[mime] || obj.inspect) : obj.to_s
      elsif obj.respond_to?(:to_iruby)
        rich_mime, rich = obj.to_iruby
        data[rich_mime] = rich
      elsif obj.respond_to?(:to_html)
        data['text/html'] = obj.to_html
      end
      plain = obj.inspect.to_s
      plain = plain[0, MAX_PLAIN] + "... [#{plain.size - MAX_PLAIN} characters cut]" if plain.size > MAX_PLAIN
      data['text/plain'] ||= plain
      data
    end

    def display(data, metadata)
      flush
      send_record(type: 'display', data: data, metadata: metadata || {})
    end

    def table_rows(rows, header)
      if rows.is_a?(Hash) # columns
        header ||= rows.keys
        columns = rows.values.map(&:to_a)
        length = columns.map(&:size).max || 0
        return [(0...length).map { |i| columns.map { |c| c[i] } }, header]
      end
      rows = rows.to_a
      if rows.first.is_a?(Hash)
        header ||= rows.flat_map(&:keys).uniq
        return [rows.map { |r| header.map { |k| r[k] } }, header]
      end
      [rows.map { |r| r.is_a?(Array) ? r : [r] }, header]
    end

    def escape_html(value)
      value.to_s.gsub('&', '&amp;').gsub('<', '&lt;').gsub('>', '&gt;').gsub('"', '&quot;')
    end

    def send_record(record)
      @records.write(JSON.generate(clean(record)) + "\n")
    end

    # valid UTF-8 everywhere (a cell's strings may be binary or broken)
    def clean(value)
      case value
      when String
        s = value.encoding == Encoding::UTF_8 ? value : value.dup.force_encoding(Encoding::UTF_8)
        s.valid_encoding? ? s : s.scrub("\uFFFD")
      when Hash then value.to_h { |k, v| [clean(k.to_s), clean(v)] }
      when Array then value.map { |v| clean(v) }
      when Symbol then clean(value.to_s)
      when nil, true, false, Integer then value
      when Float then value.finite? ? value : value.to_s
      else clean(value.to_s)
      end
    end
  end
end

KernelgwDriver.start(*ARGV.shift(2).map { |fd| Integer(fd) })
